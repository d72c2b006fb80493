"""apply_bitmask on CPU against a plain bit-by-bit reference, all rows and a subset of rows."""

from __future__ import annotations

import torch

from trtllm_gateway.engine.guided.matcher import apply_bitmask, bitmask_width

VOCAB = 1000  # not a multiple of 32: the last word's high bits fall outside the vocabulary


def _reference(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    for r in range(mask.shape[0]):
        for t in range(logits.shape[1]):
            if not (int(mask[r, t // 32]) >> (t % 32)) & 1:
                out[r, t] = float("-inf")
    return out


def _random_mask(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randint(-(2**31), 2**31 - 1, (rows, bitmask_width(VOCAB)), generator=gen)
    return wide.to(torch.int32)


def test_all_rows_match_reference() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    mask = _random_mask(3, 1)
    want = _reference(logits, mask)
    apply_bitmask(logits, mask)
    assert torch.equal(logits, want)


def test_subset_of_rows_leaves_others_alone() -> None:
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(2))
    mask = _random_mask(2, 3)
    want = logits.clone()
    want[[1, 3]] = _reference(logits[[1, 3]], mask)
    apply_bitmask(logits, mask, [1, 3])
    assert torch.equal(logits, want)
