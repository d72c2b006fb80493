"""The sibling protocol (versions 1 and 2): every path and JSON message between gateway instances.

    GET    /internal/v1/info        -> SiblingInfo     compatibility check before the first prefill
    POST   /internal/v1/prefill     PrefillBody -> PrefillAnswer     a context phase on a sibling
    GET    /internal/v1/kv/{id}     -> kv_wire blob     the held prompt KV; frees it
    DELETE /internal/v1/kv/{id}     -> KvReleased       free held KV without pulling it
    POST   /internal/v1/kv/{id}/lease  -> KvLease       keep held KV while the decode side waits
    POST   /internal/v1/encode      embed_wire pixels -> embed_wire embeds   (EPD)
    GET    /internal/v1/kv-events   NDJSON: Hello, then Resync | Heartbeat | kv_events lines
    GET    /internal/v1/load        -> Load
  version 2 (KV transfer v2; /info's protocol_versions says a sibling speaks it):
    POST   /internal/v2/prefill     PrefillBodyV2 -> PrefillAnswerV2 with `kv`, a KvRegion: where
                                    the KV is staged (shm, cuda_ipc), never its bytes
    GET    /internal/v2/kv/{id}     -> kv_stream frames (the HTTP path); frees the region
    DELETE /internal/v1/kv/{id}     the decode side copied the region (or gave up): free it

A decode instance picks the transport from the sibling's /info (capability exchange): same host
(it can read the sibling's shared-memory arena and finds its probe token there) and both on
CUDA: cuda_ipc; same host: shm; else the HTTP stream; a sibling without version 2: version 1.

The serving side (routers/internal/disagg.py, encode.py, kv_events.py) and the calling side
(engine/disagg/remote_prefill.py, remote_encode.py, kv_follow.py) both use these structs, so the
JSON is written and read in one place, as kv_wire.py and embed_wire.py do for the binary
payloads. A busy prefill sibling answers POST /prefill with 503 and its queue in two headers
(QUEUE_* below; an older sibling sends none, read as an unknown queue). Answers decode leniently
(defaults for what an older sibling may leave out); the prefill body, which anyone who reaches
the port can send, forbids unknown fields.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from trtllm_gateway.engine.kv_events.log import KvCacheEvent, event_from_json
from trtllm_gateway.engine.kv_region import KvRegion
from trtllm_gateway.engine.protocol import (
    DisaggParams,
    GuidedDecoding,
    PrefillResult,
    SamplingParams,
    TokenLogprob,
)

PROTOCOL_VERSION = 1  # the version /info announces and v1 bodies carry (old peers check it)
PROTOCOL_VERSIONS = (1, 2)
PREFIX = "/internal/v1"
INFO_PATH = f"{PREFIX}/info"
PREFILL_PATH = f"{PREFIX}/prefill"
KV_PATH = PREFIX + "/kv/{ctx_request_id}"  # a route template; kv_path() fills it in
LEASE_PATH = KV_PATH + "/lease"
ENCODE_PATH = f"{PREFIX}/encode"
KV_EVENTS_PATH = f"{PREFIX}/kv-events"
LOAD_PATH = f"{PREFIX}/load"
# A 503 from POST /prefill: the context phases the sibling has admitted and not finished, and
# their prompt tokens (what a prompt sent now would wait behind).
QUEUE_REQUESTS_HEADER = "X-Prefill-Queue-Requests"
QUEUE_TOKENS_HEADER = "X-Prefill-Queue-Tokens"
PREFILL_V2_PATH = "/internal/v2/prefill"
KV_V2_PATH = "/internal/v2/kv/{ctx_request_id}"
NIXL_V2_PATH = "/internal/v2/nixl/{arena}"  # a staging arena's NIXL agent (kv_nixl.py)
KvTransport = Literal["cuda_ipc", "shm", "http", "nixl"]

T = TypeVar("T")
_AT = re.compile(r" - at `\$\.(\w+)")
_NAMED = re.compile(r"^Object (?:missing required|contains unknown) field `(\w+)`$")


class SiblingWireError(ValueError):
    """A sibling message that does not parse or does not hold what its type promises.

    field names the top-level field at fault when there is one (the router's error param).
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def kv_path(ctx_request_id: str) -> str:
    return KV_PATH.format(ctx_request_id=ctx_request_id)


def lease_path(ctx_request_id: str) -> str:
    return LEASE_PATH.format(ctx_request_id=ctx_request_id)


@dataclass(frozen=True, slots=True)
class QueueReport:
    """A prefill sibling's queue as its 503 reports it (None: it did not say)."""

    requests: int | None = None
    tokens: int | None = None

    def headers(self) -> dict[str, str]:
        out = {}
        if self.requests is not None:
            out[QUEUE_REQUESTS_HEADER] = str(self.requests)
        if self.tokens is not None:
            out[QUEUE_TOKENS_HEADER] = str(self.tokens)
        return out

    @classmethod
    def of_headers(cls, headers: Mapping[str, str]) -> QueueReport:
        """The queue a 503 names; a missing or malformed header is an unknown count."""

        low = {k.lower(): v for k, v in headers.items()}

        def count(name: str) -> int | None:
            value = low.get(name.lower(), "")
            return int(value) if value.isdigit() and len(value) < 19 else None

        return cls(count(QUEUE_REQUESTS_HEADER), count(QUEUE_TOKENS_HEADER))


def kv_v2_path(ctx_request_id: str) -> str:
    return KV_V2_PATH.format(ctx_request_id=ctx_request_id)


def nixl_path(arena: str) -> str:
    return NIXL_V2_PATH.format(arena=arena)


class SiblingInfo(msgspec.Struct, frozen=True, kw_only=True):
    """GET /info: a decode instance refuses a sibling whose model, layout or version differ."""

    protocol_version: int
    model: str
    kv_layout: str
    engine: str = ""
    mode: str = ""
    protocol_versions: list[int] = msgspec.field(default_factory=lambda: [1])
    kv_arena: str = ""  # its shared-memory staging arena, and the token at its start
    kv_arena_token: str = ""
    kv_cuda: bool = False  # its KV cache is on a GPU
    kv_nixl: bool = False  # it serves its staging arena to NIXL readers (kv_nixl.py)


class PrefillBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """POST /prefill: the decode side's prompt, request id and SamplingParams as asdict() JSON.

    sampling stays a plain dict here: sampling_params() rebuilds it strictly (an unknown or
    mistyped key is an error, never silently dropped), and the router checks the ranges.
    """

    protocol_version: Annotated[int, msgspec.Meta(ge=1)] = PROTOCOL_VERSION
    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    prompt_token_ids: Annotated[list[int], msgspec.Meta(min_length=1)]
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)

    @classmethod
    def of(
        cls, request_id: str, prompt_token_ids: tuple[int, ...], sampling: SamplingParams
    ) -> PrefillBody:
        fields = asdict(sampling)
        if not fields["extra_args"]:  # left out, so a sibling from before it still reads this
            del fields["extra_args"]
        return cls(request_id=request_id, prompt_token_ids=list(prompt_token_ids), sampling=fields)

    def sampling_params(self) -> SamplingParams:
        """SamplingParams from the asdict() JSON: lists back to tuples, logit_bias and
        extra_args pairs back to tuples, the guided constraint back to a GuidedDecoding.
        Raises SiblingWireError."""
        raw = self.sampling
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        try:
            if fields.get("logit_bias"):
                fields["logit_bias"] = tuple((int(t), float(b)) for t, b in fields["logit_bias"])
            if fields.get("extra_args"):
                fields["extra_args"] = tuple(
                    (str(k), tuple(v) if isinstance(v, list) else v)
                    for k, v in fields["extra_args"]
                )
            if isinstance(fields.get("guided"), dict):
                g = fields["guided"]
                fields["guided"] = GuidedDecoding(
                    g["kind"], g.get("spec", ""), tuple(g.get("start_after", ()))
                )
            return SamplingParams(**fields)
        except (TypeError, ValueError, KeyError) as e:
            raise SiblingWireError(f"bad sampling params: {e}") from None


class PrefillBodyV2(PrefillBody, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """POST /internal/v2/prefill: a v1 body and the transport the decode side will copy with."""

    kv_transport: KvTransport = "http"


class WireDisaggParams(msgspec.Struct, frozen=True, kw_only=True):
    """The disaggregated params of a prefill answer (TensorRT-LLM's names); state in base64."""

    request_type: str = "context_only"
    ctx_request_id: str
    opaque_state: str


class PrefillAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to POST /prefill: first token(s) and what the decode side continues from."""

    protocol_version: int = PROTOCOL_VERSION
    request_id: str = ""
    first_token_ids: list[int]
    first_logprobs: list[TokenLogprob] | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    disaggregated_params: WireDisaggParams
    lease_s: float = 0.0  # how long the sibling holds the KV unpulled (0: it did not say)

    @classmethod
    def of(cls, res: PrefillResult, lease_s: float = 0.0) -> PrefillAnswer:
        return cls(
            lease_s=lease_s,
            request_id=res.request_id,
            first_token_ids=list(res.first_token_ids),
            first_logprobs=list(res.first_logprobs) if res.first_logprobs else None,
            prompt_tokens=res.prompt_tokens,
            cached_tokens=res.cached_tokens,
            disaggregated_params=WireDisaggParams(
                ctx_request_id=res.request_id,
                opaque_state=base64.b64encode(res.opaque_state).decode("ascii"),
            ),
        )

    def generation_only(self, kv_payload: bytes | None) -> DisaggParams:
        """The DisaggParams a decode-side generate continues from. Raises SiblingWireError."""
        d = self.disaggregated_params
        try:
            state = base64.b64decode(d.opaque_state, validate=True)
        except binascii.Error as e:
            raise SiblingWireError(f"opaque_state is not base64: {e}") from None
        lps = tuple(self.first_logprobs) if self.first_logprobs is not None else None
        first = tuple(self.first_token_ids)
        return DisaggParams("generation_only", first, lps, d.ctx_request_id, state, kv_payload)


class PrefillAnswerV2(PrefillAnswer, frozen=True, kw_only=True):
    """The answer to POST /internal/v2/prefill: v1's, and where the KV is staged."""

    protocol_version: int = 2
    kv: KvRegion | None = None

    @classmethod
    def staged(cls, res: PrefillResult, kv: KvRegion, lease_s: float = 0.0) -> PrefillAnswerV2:
        v1 = PrefillAnswer.of(res, lease_s)
        fields = {f: getattr(v1, f) for f in v1.__struct_fields__ if f != "protocol_version"}
        return cls(**fields, kv=kv)


class KvReleased(msgspec.Struct, frozen=True):
    """DELETE /kv/{id}: always true (releasing unknown or already pulled KV is a no-op)."""

    released: bool = True


class KvLease(msgspec.Struct, frozen=True, kw_only=True):
    """POST /kv/{id}/lease: held KV kept lease_s more seconds from now (unknown ids: a no-op)."""

    lease_s: float


class Load(msgspec.Struct, frozen=True, kw_only=True):
    """GET /load: what a KV-aware router weighs besides the prefix it would hit."""

    state: str
    running: int
    waiting: int
    kv_usage: float
    kv_blocks_total: int
    kv_blocks_used: int
    kv_active_blocks: int  # the same count under Dynamo's name (its workers' kv_active_blocks)
    data_parallel_rank: int
    in_flight: int
    queued: int


# --- the kv-events stream's own lines (the events themselves: engine/kv_events/log.py) --------
class Hello(msgspec.Struct, frozen=True, kw_only=True, tag=True, tag_field="type"):
    """First line of every stream: another `instance` than before means the sibling restarted."""

    instance: str
    block_size: int = 0
    num_blocks: int = 0
    next_id: int = 0


class Resync(msgspec.Struct, frozen=True, tag=True, tag_field="type"):
    """Events after the reader's cursor were dropped: forget what you knew of this instance."""


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True, tag=True, tag_field="type"):
    """An idle stream is still alive."""

    next_id: int = 0


@dataclass(frozen=True, slots=True)
class KvEventLine:
    """One KV cache event of the stream with its id (None when a sibling sent none)."""

    event_id: int | None
    event: KvCacheEvent


StreamLine = Hello | Resync | Heartbeat | KvEventLine
_CONTROL: dict[str, type[Hello | Resync | Heartbeat]] = {
    "Hello": Hello,
    "Resync": Resync,
    "Heartbeat": Heartbeat,
}


def encode_line(msg: Hello | Resync | Heartbeat | dict[str, Any]) -> bytes:
    """One NDJSON line of the kv-events stream (an event is kv_events.event_json's dict)."""
    return msgspec.json.encode(msg) + b"\n"


def decode_line(line: str | bytes) -> StreamLine:
    """One kv-events stream line. Raises SiblingWireError (a ValueError) on anything else."""
    try:
        raw = msgspec.json.decode(line, type=dict[str, Any])
        control = _CONTROL.get(raw.get("type", ""))
        if control is not None:
            return msgspec.convert(raw, control)
        event_id = raw.get("event_id")
        return KvEventLine(event_id if isinstance(event_id, int) else None, event_from_json(raw))
    except ValueError as e:
        raise SiblingWireError(f"bad kv-events line: {e}") from None


def encode(msg: msgspec.Struct) -> bytes:
    return msgspec.json.encode(msg)


def decode(data: bytes | str, kind: type[T]) -> T:
    """A sibling's JSON as `kind`. Raises SiblingWireError with msgspec's reason and field."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as e:
        raise SiblingWireError(str(e), _field(str(e))) from None
    except msgspec.DecodeError as e:
        raise SiblingWireError(f"malformed JSON: {e}") from None
    except RecursionError:  # msgspec's own depth guard: 10 000 nested objects in `sampling`
        raise SiblingWireError("JSON nested too deeply") from None


def _field(message: str) -> str | None:
    # msgspec ends the message with the bad value's path ("... - at `$.request_id`"), or names
    # the field itself ("Object missing required field `request_id`", "... unknown field ...").
    at = _AT.search(message) or _NAMED.search(message)
    return at.group(1) if at else None
