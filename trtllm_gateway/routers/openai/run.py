"""The run step chat and completions share, and the admission around their handlers.

Each endpoint's handler goes one way, parse -> run -> render (routers/openai/chat/router.py,
routers/openai/completions/router.py): its parse builds one engine request per choice with
Run.choice,
Run.generate runs them (the fan-out over choices), and streaming.respond renders the deltas
with the endpoint's Renderer. Nothing here calls back into an endpoint.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Coroutine, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput, SamplingParams
from trtllm_gateway.routers.openai.choice_output import ChoiceOutput
from trtllm_gateway.routers.openai.fanout import Choice, Item, choice_stream, merge
from trtllm_gateway.routers.openai.renderer import Envelope
from trtllm_gateway.routers.openai.schemas import SamplingFields
from trtllm_gateway.web import request_context, tracing
from trtllm_gateway.web.admission import Slot
from trtllm_gateway.web.cancel import cancel_on_disconnect
from trtllm_gateway.web.deps import Serving
from trtllm_gateway.web.sse import EventStreamResponse


async def admitted(
    slot: Slot, request: Request, handler: Coroutine[Any, Any, Response]
) -> Response:
    """Await the handler under the disconnect watcher, holding the admission slot (reserved
    before any work: a full server answers 503 + Retry-After first) until the response has
    ended: a stream releases it when it closes."""
    try:
        response = await cancel_on_disconnect(request.receive, handler)
    except BaseException:
        slot.release()
        raise
    if isinstance(response, EventStreamResponse):
        response.on_close(slot.release)
    else:
        slot.release()
    return response


class Run:
    """One HTTP request's engine requests, one per choice: their ids, and the fan-out that runs
    them."""

    def __init__(self, serving: Serving, body: SamplingFields, request_id: str) -> None:
        """`request_id`: a valid client X-Request-Id (vLLM does the same), else `{prefix}-{hex}`
        (request_context.new_request_id); the id the response echoes and every log line of the
        request carries."""
        self.arrival = time.monotonic()
        self.serving = serving
        self.body = body
        # A LoRA adapter's name as the model selects it (vLLM, trtllm-serve); echoed back.
        self.lora_name = body.model if body.model in serving.info.lora_names else None
        self.envelope = Envelope.of(body, request_id, self.lora_name or serving.model_name)
        self._engine_prefix = _engine_prefix(request_id)
        if tracing.active():
            _annotate(body)

    @property
    def request_id(self) -> str:
        return self.envelope.request_id

    def choice(
        self,
        index: int,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        images: tuple[ImageInput, ...] = (),
        keep_special_tokens: bool = False,
    ) -> Choice:
        """Choice `index`: its engine request, and its output, which applies the stop strings."""
        output = ChoiceOutput(
            self.serving.tokenizer,
            prompt_token_ids,
            stop=self.body.stop_strings,
            include_stop_str_in_output=self.body.include_stop_str_in_output,
            stop_token_ids=sampling.stop_token_ids,
            keep_special_tokens=keep_special_tokens,
        )
        engine_id = f"{self._engine_prefix}-{index}"
        request = GenerateRequest(
            engine_id,
            tuple(prompt_token_ids),
            sampling,
            images,
            lora_name=self.lora_name,
            trace_headers=tracing.trace_headers(),
        )
        return Choice(index, request, output)

    def generate(self, choices: Sequence[Choice]) -> AsyncGenerator[Item, None]:
        """Every choice's deltas, merged as they come; the engine requests start when the
        stream is first iterated, at most --max-running-choices of them at once."""
        serving = self.serving
        recorders = serving.metrics.recorders(self.arrival, len(choices))
        running = serving.admission.per_request
        places = asyncio.Semaphore(running) if running and len(choices) > running else None
        streams = [
            choice_stream(serving.engine, c, recorder, places)
            for c, recorder in zip(choices, recorders, strict=True)
        ]
        return merge(streams)


def _annotate(body: SamplingFields) -> None:
    """The sampling knobs the request set, on its trace span (vLLM's attributes)."""
    a = tracing.SpanAttributes
    max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens
    tracing.annotate(
        {
            a.GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            a.GEN_AI_REQUEST_TEMPERATURE: body.temperature,
            a.GEN_AI_REQUEST_TOP_P: body.top_p,
            a.GEN_AI_REQUEST_N: body.n,
        }
    )


def _engine_prefix(request_id: str) -> str:
    """The engine ids of one HTTP request's choices are `{prefix}-{index}`. A client's
    X-Request-Id may be sent by several requests at once (retries, one id per session), so it
    also gets a short random tag; the engine keys requests by id and would refuse the second."""
    ctx = request_context.current()
    if ctx is not None and ctx.client_supplied:
        return f"{request_id}-{uuid.uuid4().hex[:8]}"
    return request_id
