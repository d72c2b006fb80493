"""POST /v1/chat/completions, one way: parse (routers/openai/chat/parse.py), run
(routers/openai/run.py), render
(routers/openai/chat/render.py, written out by streaming.respond)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trtllm_gateway.multimodal import PixelLease
from trtllm_gateway.routers.openai.chat.parse import parse_chat
from trtllm_gateway.routers.openai.chat.render import ChatRenderer
from trtllm_gateway.routers.openai.run import Run, admitted
from trtllm_gateway.routers.openai.schemas import ChatCompletionRequest
from trtllm_gateway.routers.openai.streaming import respond
from trtllm_gateway.web import request_context
from trtllm_gateway.web.deps import Serving, ServingDep, StateDep
from trtllm_gateway.web.state import State

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, serving: ServingDep, state: StateDep
) -> Response:
    run = Run(serving, body, request_context.new_request_id("chatcmpl"))
    slot = serving.admission.reserve(body.n)  # before any work: 503 + Retry-After when full
    pixels = state.metrics.pixels.lease()  # the images are dropped when the response ends
    slot.on_release(pixels.release)
    return await admitted(slot, request, _chat_completion(body, serving, state, run, pixels))


async def _chat_completion(
    body: ChatCompletionRequest, serving: Serving, state: State, run: Run, pixels: PixelLease
) -> Response:
    parsed = await parse_chat(body, serving, state, run, pixels)
    outputs = [c.output for c in parsed.choices]
    renderer = ChatRenderer(
        run.envelope, body, serving.tokenizer, outputs, parsed.reply, parsed.prompt_tokens
    )
    return await respond(run, run.generate(parsed.choices), renderer)
