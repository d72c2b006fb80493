"""Step failures: which errors of a forward pass fail the step's requests, and which end the core.

A forward pass that raises on what its requests brought (a tensor of the wrong width that got
past the checks at the edge, a processor's state) is that step's problem: its requests fail with
a RequestFailedError (a 500), their blocks go back (nothing of the step was committed to the
prefix cache: Scheduler.commit runs after the forward), and the core goes on. An error that says
the device or the process is broken is not one step's: an asynchronous CUDA error leaves the
context unusable (every later call fails with it: the CUDA Programming Guide, "Error Checking"),
and an out-of-memory error means the KV cache was sized without room for this step's
activations, which the next steps would repeat one request at a time. Those stay fatal: the core
dies, every stream gets its 503 and the server exits to be restarted.
"""

from __future__ import annotations

import logging

import torch

from trtllm_gateway.engine.protocol import RequestFailedError

logger = logging.getLogger(__name__)

# What the CUDA runtime and its libraries put in the messages of errors that poison the context.
_DEVICE_BROKEN = (
    "CUDA error",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "cuDNN error",
    "NCCL",
    "device-side assert",
    "illegal memory access",
)


def is_fatal(exc: BaseException) -> bool:
    """True for errors that mean the engine itself is broken (the device, its memory)."""
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    accelerator = getattr(torch, "AcceleratorError", None)  # CUDA errors, torch >= 2.8
    if accelerator is not None and isinstance(exc, accelerator):
        return True
    text = str(exc)
    return any(mark in text for mark in _DEVICE_BROKEN)


def step_failed(exc: Exception, requests: int) -> RequestFailedError:
    """The error each request of a failed step gets (logged once, with its traceback)."""
    logger.error(
        "the engine step failed; failing its %d requests, the engine goes on",
        requests,
        exc_info=exc,
    )
    return RequestFailedError(f"the engine step failed: {type(exc).__name__}: {exc}")
