"""Disaggregation glue: TensorRT-LLM DisaggregatedParams <-> the protocol's opaque bytes.

A context-only result becomes PrefillResult.opaque_state: UTF-8 JSON holding the context
request id, first tokens, draft tokens, the finish reason and TensorRT-LLM's own opaque_state as
standard base64 (what trtllm-serve calls encoded_opaque_state). The HTTP layer base64s these
bytes once more; the decode side unpacks them and calls generate_async(generation_only) with the
same prompt token ids. Encoder results (EPD) use the same envelope with kind="encode".
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from engine.protocol import DisaggParams, GenerateRequest, InvalidRequestError, TokenEvent, Usage
from engine.trtllm.outputs import map_finish_reason

FORMAT = "trtllm-disagg/1"


@dataclass(frozen=True, slots=True)
class ContextState:
    ctx_request_id: int
    first_gen_tokens: tuple[int, ...]
    draft_tokens: tuple[int, ...] | None
    opaque_state: bytes | None
    finish_reason: str | None


def pack_context(params: Any, finish_reason: str | None) -> bytes:
    """Serialize a context-only result's `DisaggregatedParams` for the decode sibling."""
    raw = params.opaque_state
    body = {
        "format": FORMAT,
        "kind": "context",
        "ctx_request_id": int(params.ctx_request_id),
        "first_gen_tokens": list(params.first_gen_tokens or []),
        "draft_tokens": list(params.draft_tokens) if params.draft_tokens else None,
        "encoded_opaque_state": base64.b64encode(raw).decode("ascii") if raw else None,
        "finish_reason": finish_reason,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def unpack_context(disagg: DisaggParams) -> ContextState:
    """Read what a prefill sibling sent; InvalidRequestError if it is not ours or is damaged."""
    body = _load(disagg.opaque_state, "context")
    try:
        encoded = body.get("encoded_opaque_state")
        return ContextState(
            ctx_request_id=int(body["ctx_request_id"]),
            first_gen_tokens=tuple(int(t) for t in body["first_gen_tokens"]),
            draft_tokens=tuple(body["draft_tokens"]) if body.get("draft_tokens") else None,
            opaque_state=base64.b64decode(encoded, validate=True) if encoded else None,
            finish_reason=body.get("finish_reason"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"malformed disaggregated params: {exc}") from None


def to_generation_only(llmapi: Any, state: ContextState) -> Any:
    """The decode side's `DisaggregatedParams(request_type="generation_only", ...)`."""
    return llmapi.DisaggregatedParams(
        request_type="generation_only",
        first_gen_tokens=list(state.first_gen_tokens),
        ctx_request_id=state.ctx_request_id,
        opaque_state=state.opaque_state,
        draft_tokens=list(state.draft_tokens) if state.draft_tokens else None,
    )


def pack_encoder(params: Any, handle: Any) -> bytes:
    """Serialize an encoder result (embedding handles and hashes) for the prefill side."""
    body = {
        "format": FORMAT,
        "kind": "encode",
        "multimodal_embedding_handles": params.multimodal_embedding_handles or [handle],
        "multimodal_hashes": params.multimodal_hashes,
    }
    return json.dumps(body, separators=(",", ":"), default=str).encode()


def to_context_only(llmapi: Any, disagg: DisaggParams | None) -> Any:
    """Context-only params, carrying encoder handles when an encode sibling sent some."""
    if disagg is None or not disagg.opaque_state:
        return llmapi.DisaggregatedParams(request_type="context_only")
    body = _load(disagg.opaque_state, "encode")
    return llmapi.DisaggregatedParams(
        request_type="context_only",
        multimodal_embedding_handles=body.get("multimodal_embedding_handles"),
        multimodal_hashes=body.get("multimodal_hashes"),
    )


def finished_event(req: GenerateRequest, state: ContextState) -> TokenEvent:
    """The whole answer when the context phase already finished the request (end id first)."""
    tokens = state.first_gen_tokens
    return TokenEvent(
        token_ids=tokens,
        finish_reason=map_finish_reason(state.finish_reason) or "stop",
        usage=Usage(prompt_tokens=len(req.prompt_token_ids), completion_tokens=len(tokens)),
    )


def _load(data: bytes | None, kind: str) -> dict[str, Any]:
    if not data:
        raise InvalidRequestError("disaggregated params carry no state")
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidRequestError("disaggregated params are not TensorRT-LLM state") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("kind") != kind:
        raise InvalidRequestError(f"disaggregated params are not {FORMAT} {kind} state")
    return body
