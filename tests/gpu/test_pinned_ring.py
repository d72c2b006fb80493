"""PinnedRing (trtllm_gateway/engine/builtin/pinned_ring.py): uploads through reused pinned
buffers land intact even when the GPU is behind, because a buffer is rewritten only after the copy
that read it has run. With two slots and the stream held up by a sleep kernel, a ring that did not
wait would hand the device the third upload's values for the first.

    python -m pytest tests/gpu/test_pinned_ring.py -m gpu -q
"""

from __future__ import annotations

import numpy as np
import torch

from trtllm_gateway.engine.builtin.pinned_ring import HostSlots, PinnedRing


def test_uploads_land_intact_while_the_gpu_is_behind() -> None:
    ring = PinnedRing(torch.device("cuda", torch.cuda.current_device()), slots=2)
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]  # the copies queue behind it
    sizes = [1000, 5, 70_000, 1000, 3, 200_000, 17, 1]
    outs = [ring.upload(np.full(n, i, dtype=np.int64), torch.long) for i, n in enumerate(sizes)]
    torch.cuda.synchronize()
    for i, (n, out) in enumerate(zip(sizes, outs, strict=True)):
        assert out.shape == (n,)
        assert bool((out == i).all())


def test_one_event_a_group_still_guards_every_buffer() -> None:
    """Four buffers, one event for each two (recorded after the second's copy): with the stream
    held up, a lap later the first buffer of a group is rewritten only after that event, which
    stands for its copy too."""
    ring = PinnedRing(torch.device("cuda", torch.cuda.current_device()), slots=4, group=2)
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]
    sizes = [9, 70_000, 4, 1, 300, 6, 70_000, 2, 11, 5]
    outs = [ring.upload(np.full(n, i, dtype=np.int64), torch.long) for i, n in enumerate(sizes)]
    torch.cuda.synchronize()
    for i, (n, out) in enumerate(zip(sizes, outs, strict=True)):
        assert out.shape == (n,) and bool((out == i).all()), i
    assert len(ring._read) == 2


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


def test_downloads_reuse_their_buffers_only_after_the_copy_ran() -> None:
    """HostSlots: with two buffers and the stream held up, the third download waits for the
    first copy before writing that buffer again; each reader sees its own values."""
    slots = HostSlots(slots=2)
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]
    srcs = [torch.full((n,), i, dtype=torch.long, device=dev) for i, n in enumerate([7, 300])]
    hosts = [slots.download(s) for s in srcs]
    for i, (h, e) in enumerate(hosts):
        e.synchronize()
        assert h.is_pinned() and h.tolist() == [i] * h.numel()
    for i in range(2, 6):
        h, e = slots.download(torch.full((5 * i,), i, dtype=torch.long, device=dev), i % 2 == 0)
        e.synchronize()
        assert h.tolist() == [i] * (5 * i)
    # Each buffer keeps its event: two downloads on, its slot's event is recorded again.
    first = slots.download(srcs[0])[1]
    slots.download(srcs[1])
    again, e = slots.download(srcs[0])
    assert e is first
    e.synchronize()
    assert again.tolist() == [0] * 7
