"""Renderer: the render step of an endpoint (routers/openai/chat/render.py,
routers/openai/completions/render.py),
i.e. how its choices' deltas become wire objects; plus the pieces both endpoints' renderers share.

choice_output.py turns one choice's token events into text deltas; a Renderer turns those deltas
into the endpoint's chunks (stream=true) or its one response object (stream=false), as
streaming.respond asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from trtllm_gateway.routers.openai.choice_output import ChoiceDelta
from trtllm_gateway.routers.openai.chunk_template import TextChunk
from trtllm_gateway.routers.openai.fanout import Item
from trtllm_gateway.routers.openai.schemas import SamplingFields


class Renderer(Protocol):
    """Called by streaming.respond only, on the request's task; each call may keep per-choice
    state."""

    def prelude(self) -> Iterable[BaseModel]:
        """Chunks sent before any engine output (stream=true), e.g. chat's role chunks."""
        ...

    def chunks(self, index: int, delta: ChoiceDelta) -> Iterable[BaseModel | bytes]:
        """The chunks of one delta of choice `index`: models, or JSON bytes from a TextChunk."""
        ...

    def epilogue(self) -> Iterable[BaseModel]:
        """Chunks sent after every choice finished, before [DONE] (the usage chunk)."""
        ...

    def response(self, items: Sequence[Item]) -> BaseModel:
        """The stream=false response, from every delta in the order they came."""
        ...


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every chunk and response of one request carries, and the usage its stream reports."""

    request_id: str
    model: str
    created: int
    include_usage: bool  # stream_options.include_usage: one usage chunk at the end
    continuous: bool  # ...and continuous_usage_stats: usage on every chunk too

    @classmethod
    def of(cls, body: SamplingFields, request_id: str, model: str) -> Envelope:
        opts = body.stream_options
        return cls(
            request_id=request_id,
            model=model,
            created=int(time.time()),
            include_usage=bool(opts and opts.include_usage),
            continuous=bool(opts and opts.include_usage and opts.continuous_usage_stats),
        )


class TextChunks:
    """Each choice's text-only chunk (chunk_template.TextChunk), built on its first use: the
    common mid-stream chunk is then a byte splice rather than a pydantic dump."""

    def __init__(self, marked: Callable[[int, str], BaseModel]) -> None:
        """`marked(index, text)`: choice `index`'s text-only chunk with `text` in it."""
        self._marked = marked
        self._templates: dict[int, TextChunk] = {}

    def render(self, index: int, text: str) -> bytes:
        template = self._templates.get(index)
        if template is None:
            template = self._templates[index] = TextChunk(self._marked(index, TextChunk.marker()))
        return template.render(text)
