"""llava-v1.6 ("llava_next") anyres packing, as transformers' LlavaNextModel does it.

Each image is a base tile plus a grid of high-resolution tiles; the grid features are unpadded to
the image's aspect ratio, a learned newline embedding ends every row, and the base tile comes
first. Mirrors pack_image_features in transformers.models.llava_next (tested equal to it).
"""

from __future__ import annotations

from typing import Protocol

import torch

from trtllm_gateway.engine.builtin.vision.spec import VisionSpec


class TileEncoder(Protocol):
    """What packing needs of the encoder (vision/encoder.py's VisionEncoder, which imports this
    module: a protocol keeps the two free of a cycle)."""

    spec: VisionSpec
    patch_grid: int
    patch_size: int
    image_newline: torch.nn.Parameter | None

    def _project(self, pixels: torch.Tensor) -> torch.Tensor: ...


def pack_anyres(
    enc: TileEncoder, pixels: torch.Tensor, sizes: list[tuple[int, int]]
) -> list[torch.Tensor]:
    """pixels [B, max_tiles, 3, H, W] (padded), sizes (height, width) per image."""
    from transformers.models.llava_next.modeling_llava_next import (
        get_anyres_image_grid_shape,
        image_size_to_num_patches,
        unpad_image,
    )

    pinpoints = [list(p) for p in enc.spec.image_grid_pinpoints]
    tiles = [image_size_to_num_patches(s, pinpoints, enc.patch_grid) for s in sizes]
    flat = torch.cat([p[:n] for p, n in zip(pixels, tiles, strict=True)], dim=0)
    per_image = torch.split(enc._project(flat), tiles, dim=0)
    side = enc.patch_grid // enc.patch_size
    newline = enc.image_newline
    assert newline is not None
    out: list[torch.Tensor] = []
    for feats, size in zip(per_image, sizes, strict=True):
        if feats.shape[0] == 1:
            out.append(torch.cat((feats[0], newline[None].to(feats)), dim=0))
            continue
        base, grid = feats[0], feats[1:]
        rows, cols = get_anyres_image_grid_shape(size, pinpoints, enc.patch_grid)  # type: ignore[no-untyped-call]
        grid = grid.view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3).contiguous()
        grid = unpad_image(grid.flatten(1, 2).flatten(2, 3), size)  # type: ignore[no-untyped-call]
        ends = newline[:, None, None].expand(*grid.shape[:-1], 1).to(grid)
        grid = torch.cat((grid, ends), dim=-1).flatten(1, 2).transpose(0, 1)
        out.append(torch.cat((base, grid), dim=0))
    return out
