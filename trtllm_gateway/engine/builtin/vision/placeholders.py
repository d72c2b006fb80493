"""Image placeholders: expand each image token to its embedding rows, and merge the embeddings
into a packed step's input embeddings at those positions (chunked prefill takes its slice).

The gateway's prompt has one image token per image (the chat template puts it there); the
engine expands it to as many positions as the image has embedding rows, before admission, so
the sequence's prompt_len (and usage.prompt_tokens) counts the expanded prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trtllm_gateway.engine.protocol import InvalidRequestError

if TYPE_CHECKING:
    from trtllm_gateway.engine.builtin.scheduler import ScheduledChunk


@dataclass(frozen=True, slots=True)
class PlacedImage:
    """An image's embeddings [n, hidden] and the prompt position of its first row."""

    start: int
    embeds: torch.Tensor

    @property
    def end(self) -> int:
        return self.start + self.embeds.shape[0]


def expand_prompt(
    prompt: Sequence[int], image_token_id: int, embeds: Sequence[torch.Tensor]
) -> tuple[list[int], tuple[PlacedImage, ...]]:
    """Replace the k-th image token with embeds[k].shape[0] copies of it; the placements."""
    found = sum(1 for t in prompt if t == image_token_id)
    if found != len(embeds):
        raise InvalidRequestError(
            f"the prompt has {found} image placeholders but the request carries "
            f"{len(embeds)} images"
        )
    out: list[int] = []
    placed: list[PlacedImage] = []
    it = iter(embeds)
    for token in prompt:
        if token != image_token_id:
            out.append(token)
            continue
        e = next(it)
        placed.append(PlacedImage(len(out), e))
        out += [image_token_id] * e.shape[0]
    return out, tuple(placed)


def touches_images(chunks: Sequence[ScheduledChunk]) -> bool:
    """Whether any chunk of the step covers an image position."""
    for c in chunks:
        end = c.start + c.length
        for img in c.seq.images:
            if isinstance(img, PlacedImage) and img.start < end and c.start < img.end:
                return True
    return False


def image_embeds_for(
    embed_tokens: torch.nn.Module, chunks: Sequence[ScheduledChunk], input_ids: torch.Tensor
) -> torch.Tensor | None:
    """The step's input embeddings with image rows merged in; None when no chunk has any.

    chunks are in packed order: chunk i covers rows [offset, offset + length) for positions
    [start, start + length).
    """
    spans: list[tuple[int, PlacedImage, int, int]] = []
    offset = 0
    for c in chunks:
        end = c.start + c.length
        for img in c.seq.images:
            if isinstance(img, PlacedImage) and img.start < end and c.start < img.end:
                lo, hi = max(img.start, c.start), min(img.end, end)
                spans.append((offset + lo - c.start, img, lo - img.start, hi - img.start))
        offset += c.length
    if not spans:
        return None
    h: torch.Tensor = embed_tokens(input_ids)
    for row, img, a, b in spans:
        h[row : row + b - a] = img.embeds[a:b].to(h.device, h.dtype)
    return h
