"""The one engine boundary: the Engine protocol, its request/event records and errors.

EngineBase is what every engine is to the app (start, stop, health, info); Engine adds serving
requests. What only some engines can do (hand KV to a sibling, publish KV events, encode images
for a sibling) is a capability in engine/capabilities.py. Nothing here knows HTTP, pydantic or
tensors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import msgspec

from trtllm_gateway.config.mode import Mode

if TYPE_CHECKING:  # what the app reads besides serving: engine/capabilities.py
    from trtllm_gateway.engine.capabilities import EngineExtras

FinishReason = Literal["stop", "length", "abort"]
EngineState = Literal["loading", "ready", "draining", "dead"]


@dataclass(frozen=True, slots=True)
class EngineInfo:
    model_id: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    supports_images: bool = False
    mode: Mode = "aggregated"
    engine: str = "builtin"
    # Layout fingerprint a disaggregation sibling must match (model, dtype, block size, ...).
    kv_layout: str = ""
    # Requests the engine runs at once, as configured after every layer of engine args
    # (0: unknown). The gateway sizes admission from it.
    max_batch_size: int = 0
    # LoRA adapters a request may name as its model (TensorRT-LLM --lora-modules).
    lora_names: tuple[str, ...] = ()
    # The shortest edge the image processor resizes every image to (engine/image_resize.py; 0:
    # none known): the gateway counts an image's pixels after that resize.
    image_resize_edge: int = 0
    # KV transfer (engine/disagg/kv_region.py): the host arena a same-host sibling reads and
    # its probe token (a prefill instance's), and whether the KV cache is on a GPU.
    kv_arena: str = ""
    kv_arena_token: str = ""
    kv_cuda: bool = False


GuidedKind = Literal["json", "json_object", "regex", "grammar"]
# One vllm_xargs value (vLLM's extension field): a string, a number, or a list of them, as a tuple.
ExtraArg = str | int | float | tuple[str | int | float, ...]


@dataclass(frozen=True, slots=True)
class GuidedDecoding:
    """A token-level constraint on the output (structured outputs, forced tool calls).

    kind "json": spec is a JSON schema as JSON text; "json_object": any JSON object (spec "");
    "regex": spec is a regular expression the whole output matches; "grammar": spec is a Lark
    grammar (llguidance's dialect; TensorRT-LLM's guided_decoding_backend=llguidance takes it).
    OpenAI `choice` lists arrive as a regex. Engines apply the constraint once the output holds
    `start_after` (the end-of-reasoning token ids, e.g. `</think>`), from the first token when
    it is empty.
    """

    kind: GuidedKind
    spec: str = ""
    start_after: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None = off; k = chosen token plus k alternatives
    prompt_logprobs: int | None = None  # None = off; k alternatives per prompt position
    # (token id, bias added to its logit), bias clamped to [-100, 100] as OpenAI does.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's allowed_token_ids: when set, only these ids may be sampled.
    allowed_token_ids: tuple[int, ...] | None = None
    guided: GuidedDecoding | None = None
    # The request's vllm_xargs as (key, value) pairs, for the engine's logits processors.
    extra_args: tuple[tuple[str, ExtraArg], ...] = ()


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image, opaque to routers: its BLAKE3 hash and decoded pixels (engine payload)."""

    hash: str
    payload: object = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DisaggParams:
    """Result of a sibling's context phase carried into a decode-side generate.

    request_type is "generation_only" on the decode side. opaque_state is engine-specific bytes
    (TensorRT-LLM's opaque state, or the built-in engine's serialized KV blocks).
    """

    request_type: Literal["context_only", "generation_only"]
    first_token_ids: tuple[int, ...] = ()
    first_logprobs: tuple[TokenLogprob, ...] | None = None
    ctx_request_id: str | None = None
    opaque_state: bytes | None = None
    kv_payload: object = field(default=None, compare=False, repr=False)
    # context_only: stage the KV on the GPU for a sibling that copies it over CUDA IPC.
    kv_device: bool = False


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    images: tuple[ImageInput, ...] = ()
    disagg: DisaggParams | None = None
    lora_name: str | None = None  # one of EngineInfo.lora_names, or the base model
    # W3C trace context (traceparent, tracestate) for the request's calls to siblings; empty
    # unless --otlp-traces-endpoint is set (web/tracing.py).
    trace_headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), best first


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Timings:
    """Per-request engine timings in seconds, sent with the final event."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0


class TokenEvent(msgspec.Struct, array_like=True, omit_defaults=True):
    """New tokens since the previous event; the last event has finish_reason and usage set.

    The one record an engine core makes per running request per step, and the bulk of what it
    sends its API servers: a msgspec Struct, not a dataclass (issue 39, item 2). Against the
    slots dataclass it was, for 256 one-token events on the 2-core EPYC: made in 31 us (70),
    encoded in 14 us (90; an array with the trailing defaults left out, 13 KB not 33 KB) and
    decoded in 55 us (180). Nobody writes one after it is made (msgspec.structs.replace makes a
    changed copy)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    # Only on the first event when prompt_logprobs was asked: one entry per prompt token after
    # the first (the first prompt token has no logprob).
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """What a context-only phase hands back to the decode side."""

    request_id: str
    first_token_ids: tuple[int, ...]
    first_logprobs: tuple[TokenLogprob, ...] | None
    prompt_tokens: int
    cached_tokens: int
    opaque_state: bytes  # engine-specific; base64 on the wire when JSON-carried


@dataclass(frozen=True, slots=True)
class EngineHealth:
    state: EngineState
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    # KV blocks held by requests now, and all there are (Dynamo's kv_active_blocks and
    # kv_total_blocks: TensorRT-LLM's usedNumBlocks and maxNumBlocks); 0 when unknown.
    kv_active_blocks: int = 0
    kv_total_blocks: int = 0
    # Cumulative counters, read by the metrics collector.
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # KV hand-offs with siblings (built-in engine): how many began here (staged for a decode
    # sibling, or loaded from a prefill sibling), and the step thread's seconds spent on them.
    kv_handoffs: int = 0
    kv_handoff_step_seconds: float = 0.0
    detail: str = ""


class EngineError(Exception):
    """Base of every error an engine raises; web/errors.py maps them to HTTP."""


class InvalidRequestError(EngineError):
    """The request can never be served as asked (bad params, does not fit).

    param names the request field at fault when the engine knows it (OpenAI's error.param).
    """

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextTooLongError(InvalidRequestError):
    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens."
        )


class OverloadedError(EngineError):
    """Temporarily cannot take the request (queue full, draining)."""


class EngineDeadError(EngineError):
    """The engine failed and serves nothing more; health is dead."""


class RequestFailedError(EngineError):
    """The engine failed this request on its own fault, not the client's (a logits processor's
    bug, a forward pass that raised), and goes on serving the others."""


class RemotePrefillFailedError(EngineError):
    """A sibling prefill failed and local fallback was not allowed."""


def check_token_ids(ids: Iterable[int], vocab: int, param: str) -> tuple[int, ...]:
    """The ids as a tuple, or InvalidRequestError naming `param` at the first id outside
    [0, vocab).

    The one check of the token ids a request gives (a prompt as ids, stop_token_ids, logit_bias,
    allowed_token_ids), made where the request enters: the HTTP routes, before any work
    (routers/openai/validation.py, for the sibling API's sampling too), and an engine's door for
    callers that come without them (engine/builtin/sequence_builder.py; TensorRT-LLM's
    embedding_bias). The step trusts it: on CUDA an id past the logits is a device assert that
    ends the process, not an exception.
    """
    out = tuple(ids)
    bad = next((t for t in out if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidRequestError(
            f"{param} has token id {bad} outside the vocabulary [0, {vocab}).", param=param
        )
    return out


@runtime_checkable
class EngineBase(Protocol):
    """What every engine is to the app, an encode-only one too. Only the lifespan calls
    start/stop."""

    info: EngineInfo

    @property
    def extras(self) -> EngineExtras:
        """Read by the lifespan after start(); a wrapper returns its inner engine's plus its own."""
        ...

    async def start(self) -> None:
        """Load weights and begin serving; health() is "loading" until this returns."""

    async def stop(self) -> None:
        """Abort everything in flight, join worker threads, release device memory."""

    def health(self) -> EngineHealth:
        """Cheap, non-blocking snapshot for /health and the metrics gauges."""
        ...


@runtime_checkable
class Engine(EngineBase, Protocol):
    """An engine that serves generation requests (every mode but encode)."""

    def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """Stream token events for one request.

        The caller must close the iterator (aclosing); closing or cancelling it before the final
        event aborts the request and frees its KV blocks within one engine step. Raises
        EngineError subclasses, before the first event where it can.
        """
        ...

    async def prefill(self, req: GenerateRequest) -> PrefillResult:
        """Run the context phase only and keep its KV state for a decode sibling to take."""
        ...

    def abort(self, request_id: str) -> None:
        """Idempotent; unknown ids are ignored."""
