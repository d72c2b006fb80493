"""PinnedRing (trtllm_gateway/engine/builtin/pinned_ring.py): uploads through reused pinned
buffers land intact even when the GPU is behind, because a buffer is rewritten only after the copy
that read it has run. With two slots and the stream held up by a sleep kernel, a ring that did not
wait would hand the device the third upload's values for the first.

    python -m pytest tests/gpu/test_pinned_ring.py -m gpu -q
"""

from __future__ import annotations

import numpy as np
import torch

from trtllm_gateway.engine.builtin.pinned_ring import PinnedRing


def test_uploads_land_intact_while_the_gpu_is_behind() -> None:
    ring = PinnedRing(torch.device("cuda", torch.cuda.current_device()), slots=2)
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]  # the copies queue behind it
    sizes = [1000, 5, 70_000, 1000, 3, 200_000, 17, 1]
    outs = [ring.upload(np.full(n, i, dtype=np.int64), torch.long) for i, n in enumerate(sizes)]
    torch.cuda.synchronize()
    for i, (n, out) in enumerate(zip(sizes, outs, strict=True)):
        assert out.shape == (n,)
        assert bool((out == i).all())


def test_dtypes_shapes_and_empty() -> None:
    ring = PinnedRing(torch.device("cuda", torch.cuda.current_device()), slots=4)
    table = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = ring.upload(table, torch.int32)
    assert got.dtype == torch.int32
    assert got.cpu().numpy().tolist() == table.tolist()
    assert ring.upload([3, 1, 2], torch.long).cpu().tolist() == [3, 1, 2]
    assert ring.upload(np.array([1.5, -2.0]), torch.float32).cpu().tolist() == [1.5, -2.0]
    empty = ring.upload(np.zeros((0, 1), dtype=np.int32), torch.int32)
    assert empty.shape == (0, 1) and empty.is_cuda
