"""Stand-in `tensorrt_llm.executor.proxy`: GenerationExecutorProxy.submit over one worker.

Upstream (tensorrt_llm/executor/proxy.py, `GenerationExecutorProxy.submit`, 1.2 window): puts
the request on the worker's queue, then `error = self.request_error_queue.get()` and
`raise error` if it is an Exception (a RequestError, or worker_main's "Failed during
generation"). Once the worker has ended nothing answers that queue any more: the real `get()`
blocks forever, and the requests in flight get no further response (worker_main told the
proxy's result thread to quit). The stand-in models the second (executor/result.py: a read of
a request in flight waits for ever, so the adapter must wake its streams itself) and is kinder
on the first only, so that a test cannot hang in a submit: a later submit raises. A correct
adapter never submits again after the first "Failed during generation".
"""

from __future__ import annotations

from typing import Any

from tensorrt_llm.executor.base_worker import GenerationRequest
from tensorrt_llm.executor.worker import Worker


class GenerationExecutorProxy:
    def __init__(self, args: Any) -> None:
        self.worker = Worker(args)

    @property
    def worker_died(self) -> bool:
        return self.worker.died is not None

    def submit(self, request: GenerationRequest) -> None:
        if self.worker.died is not None:
            raise RuntimeError(
                "stand-in: the executor worker is gone (the real proxy blocks forever here): "
                f"{self.worker.died}"
            )
        error = self.worker.serve_one(request)
        if isinstance(error, Exception):
            raise error
