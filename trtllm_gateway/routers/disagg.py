"""Sibling-facing endpoints for disaggregated serving (protocol version 1).

    GET    /internal/v1/info           model, KV layout and protocol version (compatibility check)
    POST   /internal/v1/prefill        run a context phase; JSON with the first token(s) and the
                                       disaggregated params (opaque_state base64)
    GET    /internal/v1/kv/{id}        the held prompt KV as a binary kv_wire stream; frees it
    DELETE /internal/v1/kv/{id}        free held KV without pulling it

A client (the decode sibling) that disconnects during the prefill cancels it and frees its blocks.
A prefill takes an admission slot like a generation request (503 + Retry-After when full).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from trtllm_gateway.app.cancel import cancel_on_disconnect
from trtllm_gateway.app.deps import ServingDep
from trtllm_gateway.app.errors import BadRequestError, NotFoundError
from trtllm_gateway.engine.protocol import (
    EngineError,
    GenerateRequest,
    GuidedDecoding,
    KvHandoff,
    PrefillResult,
    SamplingParams,
)
from trtllm_gateway.routers import validation

PROTOCOL_VERSION = 1
PREFIX = "/internal/v1"
CHUNK = 1 << 20

router = APIRouter(prefix=PREFIX, tags=["disaggregation"], include_in_schema=False)


class PrefillBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    protocol_version: int = Field(PROTOCOL_VERSION, ge=1)
    request_id: str = Field(min_length=1, max_length=256)
    prompt_token_ids: list[int] = Field(min_length=1)
    sampling: dict[str, Any] = Field(default_factory=dict)


def _sampling(raw: dict[str, Any]) -> SamplingParams:
    """SamplingParams from the asdict() JSON a sibling sent: lists back to tuples, logit_bias
    pairs back to tuples, the guided constraint back to a GuidedDecoding."""
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    try:
        if fields.get("logit_bias"):
            fields["logit_bias"] = tuple((int(t), float(b)) for t, b in fields["logit_bias"])
        if isinstance(fields.get("guided"), dict):
            g = fields["guided"]
            fields["guided"] = GuidedDecoding(
                g["kind"], g.get("spec", ""), tuple(g.get("start_after", ()))
            )
        return SamplingParams(**fields)
    except (TypeError, ValueError, KeyError) as e:
        raise BadRequestError(f"bad sampling params: {e}", param="sampling") from None


def _result_json(res: PrefillResult) -> dict[str, Any]:
    lps = [asdict(lp) for lp in res.first_logprobs] if res.first_logprobs else None
    return {
        "protocol_version": PROTOCOL_VERSION,
        "request_id": res.request_id,
        "first_token_ids": list(res.first_token_ids),
        "first_logprobs": lps,
        "prompt_tokens": res.prompt_tokens,
        "cached_tokens": res.cached_tokens,
        "disaggregated_params": {
            "request_type": "context_only",
            "ctx_request_id": res.request_id,
            "opaque_state": base64.b64encode(res.opaque_state).decode("ascii"),
        },
    }


@router.get("/info")
async def info(serving: ServingDep) -> dict[str, Any]:
    i = serving.info
    return {
        "protocol_version": PROTOCOL_VERSION,
        "model": i.model_id,
        "kv_layout": i.kv_layout,
        "engine": i.engine,
        "mode": i.mode,
    }


@router.post("/prefill")
async def prefill(body: PrefillBody, request: Request, serving: ServingDep) -> dict[str, Any]:
    if body.protocol_version != PROTOCOL_VERSION:
        raise BadRequestError(
            f"sibling protocol version {body.protocol_version} is not {PROTOCOL_VERSION}",
            param="protocol_version",
        )
    req = GenerateRequest(
        request_id=body.request_id,
        prompt_token_ids=tuple(body.prompt_token_ids),
        sampling=validation.sibling_sampling(
            _sampling(body.sampling),
            validation.vocab_bound(serving.info.vocab_size, serving.tokenizer.vocab_size),
            serving.settings.max_logprobs,
        ),
    )
    # A context phase is engine work like any request: it counts against admission, so an
    # overloaded prefill instance answers 503 and the decode sibling prefills locally.
    slot = serving.admission.reserve(1)
    try:
        res = await cancel_on_disconnect(request.receive, serving.engine.prefill(req))
    finally:
        slot.release()
    return _result_json(res)


def _handoff(serving: ServingDep) -> KvHandoff:
    if not isinstance(serving.engine, KvHandoff):
        raise NotFoundError("this engine moves KV itself; there is nothing to pull")
    return serving.engine


@router.get("/kv/{ctx_request_id}")
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


@router.delete("/kv/{ctx_request_id}")
async def release_kv(ctx_request_id: str, serving: ServingDep) -> dict[str, bool]:
    _handoff(serving).release_kv(ctx_request_id)
    return {"released": True}
