"""What crosses between the gateway's CoreClient and the engine core: typed msgspec structs.

No torch here. The protocol's frozen dataclasses (SamplingParams, TokenEvent, EngineHealth,
EngineInfo) ride inside the structs as they are; msgspec encodes them natively. A KV blob travels
as its own ZMQ frame after the message that names it, never inside the msgpack body.

    client -> core   Add, Abort, ExportKv, ReleaseKv, RenewKv, Stop (one PUSH/PULL pipe)
    client -> core   PrefixProbe -> ProbeReply                    (REQ/REP, answered off the loop)
    core -> client   Ready, OutputBatch (one per step), Reply, Dead
"""

from __future__ import annotations

from typing import Literal

import msgspec

from trtllm_gateway.engine.kv_events.log import KvCacheEvent
from trtllm_gateway.engine.kv_region import KvRegion
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    EngineDeadError,
    EngineError,
    EngineHealth,
    EngineInfo,
    InvalidRequestError,
    OverloadedError,
    RequestFailedError,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
)

ErrorKind = Literal["invalid", "context", "overloaded", "failed", "dead"]


class RequestError(msgspec.Struct, frozen=True, array_like=True):
    """An EngineError as data: its kind, message, param and (for context) the three numbers."""

    kind: ErrorKind
    message: str
    param: str | None = None
    numbers: tuple[int, ...] = ()

    @classmethod
    def of(cls, exc: BaseException) -> RequestError:
        if isinstance(exc, ContextTooLongError):
            nums = (exc.prompt_tokens, exc.max_tokens, exc.max_model_len)
            return cls("context", str(exc), exc.param, nums)
        if isinstance(exc, InvalidRequestError):
            return cls("invalid", str(exc), exc.param)
        if isinstance(exc, OverloadedError):
            return cls("overloaded", str(exc))
        if isinstance(exc, RequestFailedError):
            return cls("failed", str(exc))
        return cls("dead", str(exc) or type(exc).__name__)

    def exception(self) -> EngineError:
        if self.kind == "context" and len(self.numbers) == 3:
            return ContextTooLongError(*self.numbers)
        if self.kind in ("invalid", "context"):
            return InvalidRequestError(self.message, param=self.param)
        if self.kind == "overloaded":
            return OverloadedError(self.message)
        if self.kind == "failed":
            return RequestFailedError(self.message)
        return EngineDeadError(self.message)


# --- client -> core -------------------------------------------------------------------------
class Add(msgspec.Struct, frozen=True, tag="add"):
    """A new request. hold_kv: a context-only phase whose KV is staged for a sibling (in the
    core's GPU arena when kv_device, else its shared-memory one).

    A decode-side request (first_token_ids set) names its KV in kv_source (a sibling's region,
    engine/disagg/kv_region.py), or sends it as the first frame: the region's bytes when
    kv_source.transport is "frame", else a kv_wire blob. Then the images' pixels (embed_wire
    "pixels" frames, one body) when image_hashes is set.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    hold_kv: bool = False
    first_token_ids: tuple[int, ...] = ()
    first_logprobs: tuple[TokenLogprob, ...] | None = None
    image_hashes: tuple[str, ...] = ()
    trace_headers: tuple[tuple[str, str], ...] = ()  # GenerateRequest.trace_headers
    kv_device: bool = False
    kv_source: KvRegion | None = None


class Abort(msgspec.Struct, frozen=True, tag="abort"):
    request_id: str


class ExportKv(msgspec.Struct, frozen=True, tag="export"):
    """Where a held context phase's KV is staged: a Reply with the same cookie and the region,
    which stays until a ReleaseKv (or its lease's end)."""

    cookie: int
    request_id: str


class ReleaseKv(msgspec.Struct, frozen=True, tag="release"):
    request_id: str


class RenewKv(msgspec.Struct, frozen=True, tag="renew"):
    """Keep a held context phase's KV another hand-off timeout (the decode side still waits)."""

    request_id: str


class Stop(msgspec.Struct, frozen=True, tag="stop"):
    """Abort everything in flight, send the last batch, then Dead("stopped") and exit."""


class PrefixProbe(msgspec.Struct, frozen=True, tag="probe"):
    prompt_token_ids: tuple[int, ...]


class ProbeReply(msgspec.Struct, frozen=True, tag="probe_reply"):
    cached_tokens: int


Inbound = Add | Abort | ExportKv | ReleaseKv | RenewKv | Stop


# --- core -> client -------------------------------------------------------------------------
class Loading(msgspec.Struct, frozen=True, tag="loading"):
    """Sent while the core loads, before Ready: what it is doing (health's detail)."""

    detail: str


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    info: EngineInfo
    tokenizer_dir: str
    health: EngineHealth
    kv_blocks: int = 0  # the KV event log's num_blocks
    remote_encode: bool = False  # images go to an encode sibling (--encode-url)
    # What the core puts before this client's request ids in every batch (pipes.ManyPipes
    # sends every API server the same batch: each keeps the events under its own prefix).
    id_prefix: str = ""


class OutputBatch(msgspec.Struct, frozen=True, tag="batch"):
    """Everything one step produced: each request's new tokens, each failed request's error,
    and the health snapshot after the step."""

    events: list[tuple[str, TokenEvent]]
    errors: list[tuple[str, RequestError]]
    health: EngineHealth
    # The prefix cache's KV events since the last batch (tagged arrays).
    kv_events: list[KvCacheEvent] = []
    # Cumulative outcomes of image encodes sent to an encode sibling (--encode-url), if any.
    remote_encode: dict[str, int] | None = None


class Reply(msgspec.Struct, frozen=True, tag="reply"):
    """The answer to an ExportKv: the staged region (kv), or the error. Older cores sent a KV
    blob as the next frame, or in the shared memory segment `shm` (engine/transport/shm_blob.py)."""

    cookie: int
    error: RequestError | None = None
    kv: KvRegion | None = None
    shm: str | None = None
    size: int = 0


class Dead(msgspec.Struct, frozen=True, tag="dead"):
    """The core is gone: "stopped" after a Stop, else why it failed (load or step)."""

    detail: str
    stopped: bool = False


Outbound = Loading | Ready | OutputBatch | Reply | Dead

_encoder = msgspec.msgpack.Encoder()
_inbound: msgspec.msgpack.Decoder[Inbound] = msgspec.msgpack.Decoder(Inbound)
_outbound: msgspec.msgpack.Decoder[Outbound] = msgspec.msgpack.Decoder(Outbound)
_probe: msgspec.msgpack.Decoder[PrefixProbe | ProbeReply] = msgspec.msgpack.Decoder(
    PrefixProbe | ProbeReply
)


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_inbound(data: bytes) -> Inbound:
    return _inbound.decode(data)


def decode_outbound(data: bytes) -> Outbound:
    return _outbound.decode(data)


def decode_probe(data: bytes) -> PrefixProbe | ProbeReply:
    return _probe.decode(data)
