"""Disaggregation glue: TensorRT-LLM DisaggregatedParams <-> the protocol's opaque bytes.

A context-only result becomes PrefillResult.opaque_state: UTF-8 JSON holding the context
request id, first tokens, draft tokens, the finish reason and TensorRT-LLM's own opaque_state as
standard base64 (what trtllm-serve calls encoded_opaque_state). The HTTP layer base64s these
bytes once more; the decode side unpacks them and calls generate_async(generation_only) with the
same prompt token ids. Images are encoded (or fetched from an encode sibling) on the prefill
side and never cross this hand-off (engine.trtllm.encode).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from trtllm_gateway.engine.protocol import (
    DisaggParams,
    GenerateRequest,
    InvalidRequestError,
    TokenEvent,
    Usage,
)
from trtllm_gateway.engine.trtllm.outputs import map_finish_reason

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


def refuse_logprobs(req: GenerateRequest) -> None:
    """A 400 for logprobs on a generation-only request, before anything is submitted.

    TensorRT-LLM 1.2 has no logprob for the first token the context side hands over, and its
    result asserts `len(logprobs) == length` on every response (executor/result.py), so such
    a stream fails. engine/disagg/remote_prefill.py prefills these requests locally instead.
    """
    if req.sampling.logprobs is not None or req.sampling.prompt_logprobs is not None:
        raise InvalidRequestError(
            "logprobs are not available for a request prefilled by a sibling on TensorRT-LLM "
            "1.2 (the handed-over first token has none); prefill it locally",
            param="logprobs",
        )


def to_generation_only(llmapi: Any, state: ContextState) -> Any:
    """The decode side's `DisaggregatedParams(request_type="generation_only", ...)`."""
    return llmapi.DisaggregatedParams(
        request_type="generation_only",
        first_gen_tokens=list(state.first_gen_tokens),
        ctx_request_id=state.ctx_request_id,
        opaque_state=state.opaque_state,
        draft_tokens=list(state.draft_tokens) if state.draft_tokens else None,
    )


def to_context_only(llmapi: Any, disagg: DisaggParams | None) -> Any:
    """Context-only params for a prefill request (the decode sibling sends no encoder state)."""
    if disagg is not None and disagg.opaque_state:
        raise InvalidRequestError(
            "this TensorRT-LLM prefill instance takes no encoder state from its decode sibling"
        )
    return llmapi.DisaggregatedParams(request_type="context_only")


def finished_event(req: GenerateRequest, state: ContextState) -> TokenEvent:
    """The whole answer when the context phase already finished the request (end id first)."""
    tokens = state.first_gen_tokens
    lps = req.disagg.first_logprobs if req.disagg is not None else None
    return TokenEvent(
        token_ids=tokens,
        logprobs=lps[: len(tokens)] if lps and req.sampling.logprobs is not None else None,
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
