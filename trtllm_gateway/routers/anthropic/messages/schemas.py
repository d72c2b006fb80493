"""Messages API wire models only: the request with its content blocks and tools, the message
response and its usage (the anthropic SDK's anthropic/types/ names)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# --- request ----------------------------------------------------------------------------------


class _Loose(BaseModel):
    # Unknown fields (cache_control, citations, newer API fields) are tolerated, never a 422.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class TextBlock(_Loose):
    type: Literal["text"]
    text: str


class ImageSource(_Loose):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(_Loose):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(_Loose):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Loose):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Loose):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Loose):
    type: Literal["redacted_thinking"]
    data: str = ""


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class InputMessage(_Loose):
    # "system" turns are Claude Code's (its reminders mid-conversation); see translate.py.
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class Tool(_Loose):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class ToolChoice(_Loose):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Loose):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputFormat(_Loose):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Loose):
    format: OutputFormat | None = None


class CountTokensRequest(_Loose):
    model: str
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None  # ignored


# --- response ---------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentOut = TextOut | ThinkingOut | ToolUseOut


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentOut] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage


class TokenCount(BaseModel):
    input_tokens: int
