"""Image placeholders: expand each image token to its embedding rows, and merge the embeddings
into a packed step's input embeddings at those rows (chunked prefill takes its slice).

The gateway's prompt has one image token per image (the chat template puts it there); the
engine expands it to as many positions as the image has embedding rows, before admission, so
the sequence's prompt_len (and usage.prompt_tokens) counts the expanded prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trtllm_gateway.engine.protocol import InvalidRequestError


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


@dataclass(frozen=True, slots=True)
class ImageRows:
    """Packed rows [row, row + end - first) of a step take rows [first, end) of an image."""

    row: int
    image: PlacedImage
    first: int
    end: int


def image_rows(images: Sequence[object], start: int, length: int, row: int) -> list[ImageRows]:
    """The rows of a chunk (positions [start, start + length), packed from `row` on) that its
    sequence's images cover; chunked prefill takes each image's slice."""
    end = start + length
    out: list[ImageRows] = []
    for img in images:
        if isinstance(img, PlacedImage) and img.start < end and start < img.end:
            lo, hi = max(img.start, start), min(img.end, end)
            out.append(ImageRows(row + lo - start, img, lo - img.start, hi - img.start))
    return out


def merge_images(
    embed_tokens: torch.nn.Module, input_ids: torch.Tensor, rows: Sequence[ImageRows]
) -> torch.Tensor | None:
    """The step's input embeddings with the image rows merged in; None when there are none."""
    if not rows:
        return None
    h: torch.Tensor = embed_tokens(input_ids)
    for r in rows:
        h[r.row : r.row + r.end - r.first] = r.image.embeds[r.first : r.end].to(h.device, h.dtype)
    return h
