"""Responses API wire models only: the request with its input items and tools, the response
object with its output items, and usage (OpenAI's openai/types/responses/ names)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# --- request ----------------------------------------------------------------------------------


class _Loose(BaseModel):
    # Clients send fields we do not know (ids, statuses, newer API fields): accepted.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class ContentPart(_Loose):
    """A part of a message: input_text / input_image from users, output_text from history."""

    type: Literal[
        "input_text", "output_text", "text", "input_image", "refusal", "summary_text",
        "reasoning_text", "input_file",
    ]  # fmt: skip
    text: str | None = None
    refusal: str | None = None
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class MessageItem(_Loose):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None


class FunctionCallItem(_Loose):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(_Loose):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None


class CustomToolCallItem(_Loose):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None


class CustomToolCallOutputItem(_Loose):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None


class ReasoningItem(_Loose):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ContentPart] = Field(default_factory=list)
    content: list[ContentPart] | None = None
    encrypted_content: str | None = None


class ItemReference(_Loose):
    type: Literal["item_reference"]
    id: str


InputItem = Annotated[
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ReasoningItem
    | ItemReference,
    Field(discriminator="type"),
]


class FunctionTool(_Loose):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(_Loose):
    """Codex's free-form tools: the model writes one string (served as a function of `input`)."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None


class NamespaceTool(_Loose):
    """Codex's group of tools: served flat; a call of one names its namespace."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]]


Tool = Annotated[FunctionTool | CustomTool | NamespaceTool, Field(discriminator="type")]
# Tools that run on OpenAI's side (web_search, file_search, code_interpreter, ...): nothing here
# runs them, so they are left out of the prompt rather than refused (refusing them broke Codex
# on llama.cpp's server).
SERVED_TOOL_TYPES = ("function", "custom", "namespace")


class NamedToolChoice(_Loose):
    type: Literal["function", "custom"]
    name: str


class TextFormat(_Loose):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Loose):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(_Loose):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(_Loose):
    model: str | None = None
    input: str | list[InputItem] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    store: bool | None = True
    stream: bool | None = False
    background: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _served_tools(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [
                t for t in value if not isinstance(t, dict) or t.get("type") in SERVED_TOOL_TYPES
            ]
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _easy_messages(cls, value: Any) -> Any:
        """`{"role": ..., "content": ...}` without a type is a message (EasyInputMessage)."""
        if isinstance(value, list):
            return [
                {**v, "type": "message"} if isinstance(v, dict) and "type" not in v else v
                for v in value
            ]
        return value


# --- response ---------------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: str
    content: list[OutputText]


class FunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: str
    namespace: str | None = None  # the namespace tool it belongs to


class CustomToolCall(BaseModel):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: str


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class Reasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: str


OutputItem = OutputMessage | FunctionCall | CustomToolCall | Reasoning


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] | None = None
    store: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None
    user: str | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True
