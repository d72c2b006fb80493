"""ServingConfig: the OpenAI layer's flags (logprobs, grammars, tool/reasoning parsers, template).

openai/ and routers/internal/ read it through app.deps (Serving.config), never from config/."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServingConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_logprobs: int = Field(20, ge=0, le=20, description="Most top_logprobs a request may ask.")
    tool_call_parser: Literal[
        "auto",
        "none",
        "hermes",
        "qwen",
        "llama3_json",
        "mistral",
        "deepseek_v3",
        "deepseek_r1",
        "pythonic",
        "harmony",
    ] = Field(
        "auto",
        description="Format of the model's tool calls (auto: from the chat template; none: "
        "tool_choice auto returns content).",
    )
    reasoning_parser: Literal["deepseek_r1", "qwen3", "gpt_oss"] | None = Field(
        None, description="Split thinking into message.reasoning_content (unset: off)."
    )
    chat_template: str | None = Field(
        None, description="Jinja chat template (a file, or the text) replacing the model's."
    )
    max_grammar_bytes: int = Field(
        65536, ge=1, description="Largest response_format schema, regex or grammar, in bytes."
    )
    sse_keepalive_interval: float = Field(
        15.0,
        ge=0.0,
        description="Seconds of stream silence before a ': keep-alive' comment (0: off).",
    )
    sse_write_timeout: float = Field(
        30.0,
        ge=0.0,
        description="Seconds a stream may wait for its client to take bytes (its socket full) "
        "before it is ended, its engine requests aborted and its admission slots freed (0: no "
        "bound).",
    )
    response_store_max_count: int = Field(
        10000,
        ge=0,
        description="Most responses /v1/responses keeps for previous_response_id and GET "
        "(least recently used go first; 0: none kept).",
    )
    response_store_max_bytes: int = Field(
        256 * 2**20,
        ge=0,
        description="Most bytes of stored responses (each keeps its whole conversation).",
    )
    response_store_max_age: float = Field(
        86400.0,
        gt=0.0,
        description="Seconds a stored response lives, however recently it was used.",
    )
