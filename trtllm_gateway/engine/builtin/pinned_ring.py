"""PinnedRing: pinned host staging for a CUDA step's uploads, reused round robin.

torch's `pin_memory()` takes a block from its caching host allocator at every call and gives it
back with an event to poll; at 256 running that was ~15% of a serving core's main thread (py-spy,
H200, 2026-11-28: TritonBackend._up), for a few hundred KiB a step. Here each upload copies into
the next of a fixed set of pinned buffers and copies that to the device without blocking; a
buffer is written again only once the copy that read it has run (long past by then: `slots`
uploads later). A buffer grows when an upload needs more room.

The copies' completion is tracked a group of GROUP buffers at a time: one event, recorded after
the group's last upload, stands for its members' copies queued before it on the one stream a
ring is used from (the step thread's). An event record a copy was ~30 us of a serving core's
step on a busy host (py-spy, H200, 2026-11-29: 4.2% of its main thread at two uploads a step).
"""

from __future__ import annotations

import numpy as np
import torch

_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.long: np.dtype(np.int64),
    torch.int32: np.dtype(np.int32),
    torch.uint8: np.dtype(np.uint8),
    torch.float32: np.dtype(np.float32),
}


GROUP = 8  # buffers whose copies one event stands for


class PinnedRing:
    def __init__(self, device: torch.device, slots: int = 32, group: int = GROUP) -> None:
        """group: buffers a lap whose copies one event stands for (at most slots)."""
        group = min(group, slots)
        if slots % group:
            raise ValueError(f"slots ({slots}) must be a multiple of group ({group})")
        self.device = device
        self._bufs: list[torch.Tensor | None] = [None] * slots
        self._group = group
        # A group's event: recorded after the copy of its last buffer, so once it has run
        # every copy of the group queued before it has run too.
        self._read: list[torch.cuda.Event | None] = [None] * (slots // group)
        self._next = 0

    def upload(self, data: np.ndarray | list[int], dtype: torch.dtype) -> torch.Tensor:
        """data as a `dtype` tensor on the device; the copy is queued on the current stream."""
        src = np.asarray(data)
        np_dtype = _NUMPY.get(dtype) or torch.empty(0, dtype=dtype).numpy().dtype
        nbytes = src.size * np_dtype.itemsize
        if nbytes == 0:
            return torch.empty(src.shape, dtype=dtype, device=self.device)
        i = self._next
        self._next = (i + 1) % len(self._bufs)
        group = i // self._group
        read = self._read[group]
        if read is not None:  # recorded a lap ago, after this buffer's last copy
            read.synchronize()
        buf = self._bufs[i]
        if buf is None or buf.numel() < nbytes:
            buf = self._bufs[i] = torch.empty(
                max(2 * nbytes, 1 << 16), dtype=torch.uint8, pin_memory=True
            )
        host = buf[:nbytes].view(dtype).view(src.shape)
        # numpy's copy, not torch's: torch splits a copy past 32k elements over its intra-op
        # threads, and waking them on a host busy with API servers and clients cost ~0.5 ms a
        # step (the 256-row block table; py-spy, H200).
        np.copyto(host.numpy(), src, casting="unsafe")
        out = host.to(self.device, non_blocking=True)
        if i % self._group == self._group - 1:  # the group's last buffer: its event covers it
            if read is None:  # one event a group, recorded again each lap (a new one was ~8 us)
                read = self._read[group] = torch.cuda.Event()  # type: ignore[no-untyped-call]
            read.record()
        return out


class HostSlots:
    """Pinned host buffers for a step's results copied down, reused round robin: a sampled
    step's ids took a fresh `pin_memory` block each step (issue 39, item 2). A buffer is handed
    out again `slots` downloads later, after the copy into it has run (its event); its reader
    must be done with it by then: the step pipeline reads a step's ids one step later."""

    def __init__(self, slots: int = 8) -> None:
        self._bufs: list[torch.Tensor | None] = [None] * slots
        self._done: list[torch.cuda.Event | None] = [None] * slots
        self._blocking = [True] * slots
        self._next = 0

    def download(
        self, src: torch.Tensor, blocking: bool = True
    ) -> tuple[torch.Tensor, torch.cuda.Event]:
        """A pinned host copy of src, queued on the current stream, and the event recorded
        after it (the caller waits on it before reading; blocking: a wait that sleeps, not
        spins). The event is the buffer's own, recorded again when the buffer is handed out
        again: one a step was ~8 us of the step thread."""
        i = self._next
        self._next = (i + 1) % len(self._bufs)
        prev = self._done[i]
        if prev is not None:
            prev.synchronize()
        nbytes = src.numel() * src.element_size()
        buf = self._bufs[i]
        if buf is None or buf.numel() < nbytes:
            buf = self._bufs[i] = torch.empty(
                max(2 * nbytes, 1 << 12), dtype=torch.uint8, pin_memory=True
            )
        host = buf[:nbytes].view(src.dtype).view(src.shape)
        host.copy_(src, non_blocking=True)
        done = self._done[i]
        if done is None or self._blocking[i] != blocking:
            done = self._done[i] = torch.cuda.Event(blocking=blocking)  # type: ignore[no-untyped-call]
            self._blocking[i] = blocking
        done.record()
        return host, done
