"""Stand-in `tensorrt_llm.executor.worker`: `worker_main`'s request loop, which catches only
RequestError.

Upstream (tensorrt_llm/executor/worker.py, `worker_main`, 1.2 window):

    while (req := request_queue.get()) is not None:
        ...
        elif isinstance(req, GenerationRequest):
            try:
                worker.submit(req)
                request_error_queue.put(None)  # None means success
            except RequestError as e:
                request_error_queue.put(e)
    ...
    except Exception as e:  # other critical errors
        notify_proxy_threads_to_quit()
        err = Exception(f"Failed during generation: {e}")
        request_error_queue.put(err)

So any other exception from `submit` (BaseWorker._enqueue_request's checks before its `try`)
leaves the loop: the worker process ends, the proxy's result threads are told to quit (requests
in flight never get another response), and the proxy raises the plain Exception above.
"""

from __future__ import annotations

from typing import Any

from tensorrt_llm.executor.base_worker import BaseWorker, GenerationRequest
from tensorrt_llm.executor.utils import RequestError


class Worker(BaseWorker):
    """One worker process; `died` holds the error that ended it."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.died: Exception | None = None

    def serve_one(self, request: GenerationRequest) -> Exception | None:
        """One turn of worker_main's loop: what it puts on request_error_queue."""
        try:
            self._enqueue_request(request)
            return None
        except RequestError as e:
            return e
        except Exception as e:  # worker_main's "other critical errors": the worker ends
            self.died = Exception(f"Failed during generation: {e}")
            return self.died
