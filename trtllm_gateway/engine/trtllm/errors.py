"""TensorRT-LLM's exceptions -> EngineError subclasses, in one place for every call into it.

Classified by where the exception comes from (TensorRT-LLM 1.2, `LLM.generate_async`):
- its RequestError fails one request and the engine keeps serving;
- an exception the caller names as the request's fault (generate_async's ValueError/TypeError)
  is an InvalidRequestError (400);
- raised by TensorRT-LLM's executor (`tensorrt_llm.executor.*`: the proxy re-raising the
  worker's "Failed during generation: ..." once `worker_main` has exited, a background error)
  or "LLM is shutting down": the executor is gone, the engine is marked dead (503);
- anything else raised while building or enqueuing one request (the input processor, e.g.
  `attach_multimodal_embeddings`' NotImplementedError, tensorrt_llm/inputs/registry.py) fails
  that request only: the executor never saw it;
- whatever is raised while reading one request's results fails that request only: TensorRT-LLM
  raises from inside a result's iteration for per-request reasons too (result.py asserts on
  every response, e.g. the logprob count of a generation-only request).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from trtllm_gateway.engine.protocol import EngineDeadError, EngineError, InvalidRequestError

logger = logging.getLogger(__name__)

EXECUTOR_MODULE = "tensorrt_llm.executor"
"""Exceptions raised from here mean the executor (its worker process) is broken."""


class TrtllmRequestError(EngineError):
    """TensorRT-LLM failed this one request (its RequestError); the engine keeps serving."""


class ErrorTranslator:
    """Built once per engine: TensorRT-LLM's RequestError class is only known after import."""

    def __init__(
        self, request_error: type[BaseException], on_dead: Callable[[BaseException], None]
    ) -> None:
        self._request_error = request_error
        self._on_dead = on_dead

    @contextlib.contextmanager
    def translated(
        self, invalid: tuple[type[Exception], ...] = (), *, one_request: bool = False
    ) -> Iterator[None]:
        """Run a call into TensorRT-LLM; what escapes it is an EngineError (or a cancellation,
        which passes untouched, as does an EngineError raised inside). one_request: the call
        reads one request's results, so whatever it raises is that request's failure."""
        try:
            yield
        except self._request_error as exc:
            raise TrtllmRequestError(str(exc)) from None
        except EngineError:
            raise
        except invalid as exc:
            raise InvalidRequestError(str(exc)) from None
        except Exception as exc:
            if one_request or not executor_failed(exc):
                logger.exception("TensorRT-LLM failed one request")
                raise TrtllmRequestError(f"TensorRT-LLM failed this request: {exc!r}") from exc
            self._on_dead(exc)
            raise EngineDeadError(f"TensorRT-LLM failed: {exc}") from exc


def executor_failed(exc: BaseException) -> bool:
    """Whether `exc` comes from TensorRT-LLM's executor (the innermost frame's module), or is
    llmapi/llm.py's "LLM is shutting down" (its executor shut itself down)."""
    if isinstance(exc, RuntimeError) and "LLM is shutting down" in str(exc):
        return True
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    return module == EXECUTOR_MODULE or module.startswith(EXECUTOR_MODULE + ".")
