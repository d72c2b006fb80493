"""The one run shape chat and completions share: an endpoint parses its request into choices on a
GenerationRun and hands it a Renderer; the run owns the rest (admission, the disconnect watcher,
the fan-out over choices, streaming or not, cancellation).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from trtllm_gateway.app import request_context
from trtllm_gateway.app.cancel import cancel_on_disconnect
from trtllm_gateway.app.deps import Serving
from trtllm_gateway.app.sse import EventStreamResponse, frame
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput, SamplingParams
from trtllm_gateway.openai.choice_output import ChoiceRenderer
from trtllm_gateway.openai.fanout import Choice, choice_stream, merge
from trtllm_gateway.openai.renderer import Envelope, Renderer
from trtllm_gateway.openai.schemas import SamplingFields
from trtllm_gateway.openai.streaming import collect, peek_stream, stream_frames

# An endpoint's parse step: add the request's choices to the run, return how to render them.
Parse = Callable[["GenerationRun"], Awaitable[Renderer]]


async def serve(
    request: Request, serving: Serving, body: SamplingFields, prefix: str, weight: int, parse: Parse
) -> Response:
    """Reserve `weight` engine requests before any work (503 + Retry-After when full), parse and
    run under the disconnect watcher, and release the slot when the response has ended."""
    run = GenerationRun(serving, body, request_context.new_request_id(prefix))
    slot = serving.admission.reserve(weight)
    try:
        response = await cancel_on_disconnect(request.receive, run.respond(parse))
    except BaseException:
        slot.release()
        raise
    if isinstance(response, EventStreamResponse):
        response.on_close(slot.release)
    else:
        slot.release()
    return response


class GenerationRun:
    """One HTTP request's engine requests, one per choice, and the response built from them."""

    def __init__(self, serving: Serving, body: SamplingFields, request_id: str) -> None:
        """`request_id`: a valid client X-Request-Id (vLLM does the same), else `{prefix}-{hex}`;
        the id the response echoes and every log line of the request carries."""
        self.arrival = time.monotonic()
        self.serving = serving
        self.body = body
        # A LoRA adapter's name as the model selects it (vLLM, trtllm-serve); echoed back.
        self.lora_name = body.model if body.model in serving.info.lora_names else None
        self.envelope = Envelope.of(body, request_id, self.lora_name or serving.model_name)
        self.choices: list[Choice] = []
        self._engine_prefix = _engine_prefix(request_id)

    @property
    def request_id(self) -> str:
        return self.envelope.request_id

    def add(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        images: tuple[ImageInput, ...] = (),
        keep_special_tokens: bool = False,
    ) -> ChoiceRenderer:
        """Add the next choice (index = choices so far); its renderer applies the stop strings."""
        renderer = ChoiceRenderer(
            self.serving.tokenizer,
            prompt_token_ids,
            stop=self.body.stop_strings,
            include_stop_str_in_output=self.body.include_stop_str_in_output,
            stop_token_ids=sampling.stop_token_ids,
            keep_special_tokens=keep_special_tokens,
        )
        index = len(self.choices)
        engine_id = f"{self._engine_prefix}-{index}"
        request = GenerateRequest(
            engine_id, tuple(prompt_token_ids), sampling, images, lora_name=self.lora_name
        )
        self.choices.append(Choice(index, request, renderer))
        return renderer

    async def respond(self, parse: Parse) -> Response:
        """Parse the request (its choices), start every choice, answer: SSE or one JSON body."""
        renderer = await parse(self)
        serving = self.serving
        recorders = serving.metrics.recorders(self.arrival, len(self.choices))
        streams = [
            choice_stream(serving.engine, c, recorder)
            for c, recorder in zip(self.choices, recorders, strict=True)
        ]
        items = merge(streams)
        headers = {"X-Request-Id": self.request_id}
        if not self.body.stream:
            response = renderer.response(await collect(items))
            return JSONResponse(response.model_dump(mode="json"), headers=headers)
        prelude = [frame(c) for c in renderer.prelude()]  # before the peek: zero tokens so far
        keepalive_s = serving.settings.sse_keepalive_interval
        first = await peek_stream(items, keepalive_s)
        return EventStreamResponse(
            stream_frames(self.request_id, first, items, prelude, renderer),
            headers=headers,
            on_disconnect=serving.metrics.client_disconnected,
            keepalive_s=keepalive_s,
        )


def _engine_prefix(request_id: str) -> str:
    """The engine ids of one HTTP request's choices are `{prefix}-{index}`. A client's
    X-Request-Id may be sent by several requests at once (retries, one id per session), so it
    also gets a short random tag; the engine keys requests by id and would refuse the second."""
    ctx = request_context.current()
    if ctx is not None and ctx.client_supplied:
        return f"{request_id}-{uuid.uuid4().hex[:8]}"
    return request_id
