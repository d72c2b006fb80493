"""OpenAI wire models only: requests, responses, streaming chunks, logprobs, errors."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

# --- requests ---------------------------------------------------------------------------------


class _Request(BaseModel):
    # SDKs and proxies send fields we do not know; accept them (routers log them at debug).
    # NaN/Infinity (Python's json reads them) are never a valid number here: a 400.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "image_url", "input_text", "image_embeds"]
    text: str | None = None
    image_url: ImageURL | None = None
    # A precomputed embedding file (docs/multimodal.md): a URL, or {"url": ...}.
    image_embeds: str | ImageURL | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant history
    tool_call_id: str | None = None  # role "tool"


# --- structured outputs and tools (request side) ----------------------------------------------


class JsonSchemaFormat(BaseModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` extension: at most one constraint, and its options."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # vLLM's option name; here unset means true: JSON schemas (response_format, structured
    # outputs, forced tool calls) generate no undeclared keys. false keeps JSON Schema's reading.
    disable_additional_properties: bool | None = None


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class SamplingFields(_Request):
    """Fields chat and completions share (OpenAI's plus vLLM's extensions)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    best_of: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None  # vLLM's extension: only these ids may be sampled
    # Structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older
    # guided_* fields (routers/openai/structured.py turns them into one engine constraint).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's extension: extra per-request args for the engine's logits processors.
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None (as some SDKs send it): allowed
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's reasoning effort; gpt-oss templates read it (a chat_template_kwargs entry wins).
    reasoning_effort: Literal["low", "medium", "high"] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0)
    suffix: str | None = None


# --- shared response pieces -------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    # Only with a reasoning parser (absent otherwise, as OpenAI leaves out what does not apply).
    completion_tokens_details: CompletionTokensDetails | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_details(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("completion_tokens_details") is None:
            out.pop("completion_tokens_details", None)
        return out


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatLogprob] | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


def _now() -> int:
    return int(time.time())


# --- chat responses ---------------------------------------------------------------------------


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    # With a reasoning parser: the thinking, under vLLM's name and its newer `reasoning` alias.
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for key in ("reasoning_content", "reasoning", "tool_calls"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None

    @model_serializer(mode="plain")
    def _drop_unset(self) -> dict[str, Any]:
        return {
            k: v for k, v in (("name", self.name), ("arguments", self.arguments)) if v is not None
        }


class DeltaToolCall(BaseModel):
    """A piece of a streamed call: the first has id, type and name; later ones arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall

    @model_serializer(mode="plain")
    def _drop_unset(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out.update(id=self.id, type=self.type or "function")
        out["function"] = self.function.model_dump()
        return out


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="plain")
    def _drop_unset(self) -> dict[str, Any]:
        # OpenAI deltas carry only what changed: {"content": "hi"}, never "role": null.
        fields = (
            ("role", self.role),
            ("content", self.content),
            ("reasoning_content", self.reasoning_content),
            ("reasoning", self.reasoning),
        )
        out: dict[str, Any] = {k: v for k, v in fields if v is not None}
        if self.tool_calls is not None:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return out


class ChatCompletionChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: UsageInfo | None = None


# --- completions responses --------------------------------------------------------------------


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# --- models, health, errors -------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "trtllm-gateway"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model (vLLM's field)
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
