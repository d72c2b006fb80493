"""POST /v1/completions, one way: parse (routers/openai/completions/parse.py), run
(routers/openai/run.py), render
(routers/openai/completions/render.py, written out by streaming.respond)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from trtllm_gateway.routers.openai.completions.parse import parse_completion, prompt_count
from trtllm_gateway.routers.openai.completions.render import CompletionRenderer
from trtllm_gateway.routers.openai.run import Run, admitted
from trtllm_gateway.routers.openai.schemas import CompletionRequest
from trtllm_gateway.routers.openai.streaming import respond
from trtllm_gateway.web import request_context
from trtllm_gateway.web.deps import Serving, ServingDep

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, serving: ServingDep
) -> Response:
    run = Run(serving, body, request_context.new_request_id("cmpl"))
    weight = body.n * prompt_count(body.prompt)
    slot = serving.admission.reserve(weight)  # before any work: 503 + Retry-After when full
    return await admitted(slot, request, _completion(body, serving, run))


async def _completion(body: CompletionRequest, serving: Serving, run: Run) -> Response:
    parsed = await parse_completion(body, serving, run)
    outputs = [c.output for c in parsed.choices]
    renderer = CompletionRenderer(run.envelope, body, serving.tokenizer, outputs, parsed.prompts)
    return await respond(run, run.generate(parsed.choices), renderer)
