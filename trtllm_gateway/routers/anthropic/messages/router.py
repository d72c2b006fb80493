"""POST /v1/messages and /v1/messages/count_tokens: the request translated to chat
(translate.py), chat's parse and run, the Messages renderer (render.py). x-api-key and Bearer
are both accepted (web/auth.py); anthropic-version and anthropic-beta headers are not read."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trtllm_gateway.multimodal import PixelLease
from trtllm_gateway.routers.anthropic.messages.render import MessagesRenderer
from trtllm_gateway.routers.anthropic.messages.schemas import (
    CountTokensRequest,
    MessagesRequest,
    TokenCount,
)
from trtllm_gateway.routers.anthropic.messages.translate import to_chat, wire_param
from trtllm_gateway.routers.openai.chat.parse import parse_chat
from trtllm_gateway.routers.openai.event_stream import respond_events
from trtllm_gateway.routers.openai.run import Run, admitted
from trtllm_gateway.web import request_context
from trtllm_gateway.web.deps import Serving, ServingDep, StateDep
from trtllm_gateway.web.errors import GatewayError
from trtllm_gateway.web.state import State

router = APIRouter(tags=["anthropic"])


@router.post("/v1/messages", response_model=None)
async def create_message(
    body: MessagesRequest, request: Request, serving: ServingDep, state: StateDep
) -> Response:
    request_id = request_context.new_request_id("msg")
    slot = serving.admission.reserve(1)  # before any work: 529 + Retry-After when full
    pixels = state.metrics.pixels.lease()
    slot.on_release(pixels.release)
    return await admitted(slot, request, _create(body, serving, state, request_id, pixels))


async def _create(
    body: MessagesRequest, serving: Serving, state: State, request_id: str, pixels: PixelLease
) -> Response:
    try:
        chat = to_chat(body)
        run = Run(serving, chat, request_id)
        parsed = await parse_chat(chat, serving, state, run, pixels, clamp_max_tokens=True)
    except GatewayError as exc:
        exc.param = wire_param(exc.param)  # Anthropic's body has no param; logs and tests do
        raise
    (choice,) = parsed.choices
    renderer = MessagesRenderer(
        f"msg_{uuid.uuid4().hex}",
        run.envelope.model,
        choice.output,
        parsed.reply,
        parsed.prompt_tokens,
    )
    return await respond_events(run, run.generate(parsed.choices), renderer, body.stream)


@router.post("/v1/messages/count_tokens", response_model=None)
async def count_tokens(
    body: CountTokensRequest, serving: ServingDep, state: StateDep
) -> TokenCount:
    """The prompt's tokens as the chat template renders it (tools included); nothing runs."""
    chat = to_chat(body)
    run = Run(serving, chat, request_context.new_request_id("count"))
    pixels = state.metrics.pixels.lease()
    try:
        parsed = await parse_chat(chat, serving, state, run, pixels, clamp_max_tokens=True)
    finally:
        pixels.release()
    return TokenCount(input_tokens=parsed.prompt_tokens)
