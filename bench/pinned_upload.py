"""The CPU cost of a CUDA step's upload, part by part: PinnedRing.upload of a decode step's
inputs (256 rows and their block tables, int32) and the torch calls it is made of, each timed
alone over a few thousand calls on the calling thread (wall and thread CPU, microseconds).

  python -m bench.pinned_upload
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from trtllm_gateway.engine.builtin.pinned_ring import PinnedRing


def timed(name: str, fn: Callable[[], object], n: int = 3000) -> None:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    torch.cuda.synchronize()
    print(f"{name:36s} wall {wall / n * 1e6:7.2f} us  cpu {cpu / n * 1e6:7.2f} us")


def main() -> None:
    dev = torch.device("cuda")
    ring = PinnedRing(dev)
    src = np.random.default_rng(0).integers(0, 1000, 4 * 256 + 256 * 150, dtype=np.int32)
    dst = torch.empty(src.size, dtype=torch.int32, device=dev)
    timed("PinnedRing.upload", lambda: ring.upload(src, torch.int32))
    timed("upload, then a device copy", lambda: dst.copy_(ring.upload(src, torch.int32)))
    buf = torch.empty(2 * src.nbytes, dtype=torch.uint8, pin_memory=True)
    timed("pinned views", lambda: buf[: src.nbytes].view(torch.int32).view(src.shape))
    host = buf[: src.nbytes].view(torch.int32).view(src.shape)
    as_numpy = host.numpy()
    timed("numpy copy into pinned", lambda: np.copyto(as_numpy, src, casting="unsafe"))
    timed(".to(device, non_blocking)", lambda: host.to(dev, non_blocking=True))
    timed("device.copy_(pinned, non_blocking)", lambda: dst.copy_(host, non_blocking=True))
    timed("new Event + record", lambda: torch.cuda.Event().record())  # type: ignore[no-untyped-call]
    kept = torch.cuda.Event()  # type: ignore[no-untyped-call]
    timed("one Event recorded again", kept.record)


if __name__ == "__main__":
    main()
