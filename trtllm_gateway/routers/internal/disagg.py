"""Sibling-facing endpoints for disaggregated serving (engine/disagg/sibling_wire.py: the paths
and messages).

    GET    /internal/v1/info           model, KV layout and protocol version (compatibility check)
    POST   /internal/v1/prefill        run a context phase; JSON with the first token(s) and the
                                       disaggregated params (opaque_state base64)
    GET    /internal/v1/kv/{id}        the held prompt KV as a binary kv_wire stream; frees it
    DELETE /internal/v1/kv/{id}        free held KV without pulling it (or once copied, v2)
    POST   /internal/v1/kv/{id}/lease  keep held or staged KV --kv-handoff-timeout more seconds
    POST   /internal/v2/prefill        a context phase whose answer says where its KV is staged
    GET    /internal/v2/kv/{id}        the staged KV as kv_stream frames (the HTTP path); frees it
    GET    /internal/v2/nixl/{arena}   the staging arena registered with this process's NIXL
                                       agent: the agent's metadata and the arena's address

A client (the decode sibling) that disconnects during the prefill cancels it and frees its blocks.
A prefill takes an admission slot like a generation request, and a place in the prefill queue
(web/prefill_queue.py): full, it answers 503 + Retry-After with the queue in two headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from trtllm_gateway.engine.capabilities import KvHandoff
from trtllm_gateway.engine.disagg import kv_nixl, kv_stream
from trtllm_gateway.engine.disagg import sibling_wire as wire
from trtllm_gateway.engine.guided.compile import check_guided
from trtllm_gateway.engine.kv_region import KvRegionError
from trtllm_gateway.engine.protocol import (
    DisaggParams,
    EngineError,
    GenerateRequest,
    InvalidRequestError,
    OverloadedError,
    PrefillResult,
)
from trtllm_gateway.routers.openai import validation
from trtllm_gateway.web import request_context
from trtllm_gateway.web.cancel import cancel_on_disconnect
from trtllm_gateway.web.deps import ServingDep, StateDep
from trtllm_gateway.web.errors import BadRequestError, NotFoundError, ServiceUnavailableError

CHUNK = 1 << 20
JSON = "application/json"

router = APIRouter(tags=["disaggregation"], include_in_schema=False)


def _answer(msg: msgspec.Struct) -> Response:
    return Response(wire.encode(msg), media_type=JSON)


def _prefill_body(raw: bytes) -> wire.PrefillBody:
    """The sibling's body, or a 400 whose param is the field at fault, as for public requests."""
    try:
        return wire.decode(raw, wire.PrefillBody)
    except wire.SiblingWireError as e:
        raise BadRequestError(str(e), param=e.field) from None


@router.get(wire.INFO_PATH)
async def info(serving: ServingDep) -> Response:
    i = serving.info
    return _answer(
        wire.SiblingInfo(
            protocol_version=wire.PROTOCOL_VERSION,
            model=i.model_id,
            kv_layout=i.kv_layout,
            engine=i.engine,
            mode=i.mode,
            protocol_versions=list(wire.PROTOCOL_VERSIONS),
            kv_arena=i.kv_arena,
            kv_arena_token=i.kv_arena_token,
            kv_cuda=i.kv_cuda,
            kv_nixl=bool(i.kv_arena) and kv_nixl.available(),
        )
    )


@router.post(wire.PREFILL_PATH)
async def prefill(request: Request, serving: ServingDep, state: StateDep) -> Response:
    body = _prefill_body(await request.body())
    if body.protocol_version != wire.PROTOCOL_VERSION:
        raise BadRequestError(
            f"sibling protocol version {body.protocol_version} is not {wire.PROTOCOL_VERSION}",
            param="protocol_version",
        )
    res = await _context_phase(request, serving, state, body, None)
    return _answer(wire.PrefillAnswer.of(res, state.config.engine.kv_handoff_timeout))


@router.post(wire.PREFILL_V2_PATH)
async def prefill_v2(request: Request, serving: ServingDep, state: StateDep) -> Response:
    """A context phase whose KV is staged where the decode side will copy it from."""
    try:
        body = wire.decode(await request.body(), wire.PrefillBodyV2)
    except wire.SiblingWireError as e:
        raise BadRequestError(str(e), param=e.field) from None
    if body.protocol_version != 2:
        raise BadRequestError(
            f"sibling protocol version {body.protocol_version} is not 2", param="protocol_version"
        )
    handoff = _handoff(serving)
    disagg = DisaggParams("context_only", kv_device=body.kv_transport == "cuda_ipc")
    res = await _context_phase(request, serving, state, body, disagg)
    try:
        region = await handoff.stage_kv(res.request_id)
    except EngineError as e:
        raise NotFoundError(str(e), param="request_id") from None
    lease_s = state.config.engine.kv_handoff_timeout
    return _answer(wire.PrefillAnswerV2.staged(res, region, lease_s))


async def _context_phase(
    request: Request,
    serving: ServingDep,
    state: StateDep,
    body: wire.PrefillBody,
    disagg: DisaggParams | None,
) -> PrefillResult:
    try:
        sampling = body.sampling_params()
    except wire.SiblingWireError as e:
        raise BadRequestError(str(e), param="sampling") from None
    req = GenerateRequest(
        request_id=body.request_id,
        prompt_token_ids=tuple(body.prompt_token_ids),
        sampling=validation.sibling_sampling(
            sampling,
            validation.vocab_bound(serving.info.vocab_size, serving.tokenizer.vocab_size),
            serving.config.max_logprobs,
        ),
        disagg=disagg,
    )
    guided = req.sampling.guided
    if guided is not None:  # the public routes' bound and checks hold for a sibling too
        try:
            await asyncio.to_thread(
                check_guided, guided, serving.config.max_grammar_bytes, param="sampling"
            )
        except InvalidRequestError as e:
            raise BadRequestError(str(e), param="sampling") from None
    # A context phase is engine work like any request: it counts against admission and the
    # prefill queue; every refusal is a 503 with the queue, which the decode side's policy reads.
    queue = state.prefill_queue
    ticket = queue.enter(len(req.prompt_token_ids))
    try:
        slot = serving.admission.reserve(1)
    except ServiceUnavailableError as e:
        ticket.release()
        raise queue.busy(e.message, e.code) from None
    try:
        res = await cancel_on_disconnect(request.receive, serving.engine.prefill(req))
    except OverloadedError as e:  # the engine's bound on KV held for siblings
        raise queue.busy(str(e) or "prefill instance overloaded", "overloaded") from None
    finally:
        slot.release()
        ticket.release()
    ctx = request_context.current()
    if ctx is not None:  # the request's log line and trace span report the context phase,
        ctx.request_id = req.request_id  # under the decode side's id for it
        ctx.model = serving.model_name
        ctx.prompt_tokens = res.prompt_tokens
        ctx.completion_tokens = len(res.first_token_ids)
    return res


def _handoff(serving: ServingDep) -> KvHandoff:
    if not isinstance(serving.engine, KvHandoff):
        raise NotFoundError("this engine moves KV itself; there is nothing to pull")
    return serving.engine


@router.get(wire.KV_PATH)
async def pull_kv(ctx_request_id: str, serving: ServingDep) -> Response:
    try:
        blob = await _handoff(serving).pull_kv(ctx_request_id)
    except EngineError as e:
        raise NotFoundError(str(e), param="ctx_request_id") from None

    async def chunks() -> AsyncIterator[bytes]:
        view = memoryview(blob)
        for i in range(0, len(view), CHUNK):
            yield bytes(view[i : i + CHUNK])

    headers = {"Content-Length": str(len(blob))}
    return StreamingResponse(chunks(), media_type="application/octet-stream", headers=headers)


@router.get(wire.KV_V2_PATH)
async def stream_kv(ctx_request_id: str, serving: ServingDep) -> Response:
    """The staged region's bytes in place, header and payload as separate frames; freed once
    sent (kv_stream.py)."""
    handoff = _handoff(serving)
    try:
        region = await handoff.stage_kv(ctx_request_id)
        view = handoff.kv_view(region)
    except EngineError as e:
        raise NotFoundError(str(e), param="ctx_request_id") from None
    except KvRegionError as e:
        handoff.release_kv(ctx_request_id)
        raise NotFoundError(str(e), param="ctx_request_id") from None
    headers = {"Content-Length": str(kv_stream.stream_bytes(region))}
    return StreamingResponse(
        kv_stream.frames(region, view),
        media_type="application/octet-stream",
        headers=headers,
        background=BackgroundTask(handoff.release_kv, ctx_request_id),
    )


@router.get(wire.NIXL_V2_PATH)
async def nixl_arena(arena: str, serving: ServingDep, state: StateDep) -> Response:
    """The core's staging arena registered with this API server's NIXL agent (once), for a
    decode sibling to READ staged regions from (kv_nixl.py)."""
    handoff = _handoff(serving)
    if not kv_nixl.available():
        raise NotFoundError("NIXL is not installed here", param="arena")
    try:
        buf = handoff.kv_arena(arena)
        answer = await asyncio.to_thread(state.nixl.expose, arena, buf)
    except (KvRegionError, kv_nixl.NixlError) as e:
        raise NotFoundError(str(e), param="arena") from None
    return _answer(answer)


@router.delete(wire.KV_PATH)
async def release_kv(ctx_request_id: str, serving: ServingDep) -> Response:
    _handoff(serving).release_kv(ctx_request_id)
    return _answer(wire.KvReleased())


@router.post(wire.LEASE_PATH)
async def renew_lease(ctx_request_id: str, serving: ServingDep, state: StateDep) -> Response:
    """The decode side still wants this KV: its expiry moves to now + --kv-handoff-timeout."""
    _handoff(serving).renew_kv(ctx_request_id)
    return _answer(wire.KvLease(lease_s=state.config.engine.kv_handoff_timeout))
