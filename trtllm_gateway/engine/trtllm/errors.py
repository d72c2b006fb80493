"""TensorRT-LLM's exceptions -> EngineError subclasses, in one place for every call into it.

Its RequestError fails one request and the engine keeps serving; an exception the caller names
as the request's fault (generate_async's ValueError/TypeError) is an InvalidRequestError. Any
other exception raised while reading one request's results fails that request only: TensorRT-LLM
raises from inside a result's iteration for per-request reasons too (result.py asserts on every
response, e.g. the logprob count of a generation-only request). Any other exception from a call
on the LLM itself (generate_async) means TensorRT-LLM broke: the engine is marked dead (503).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from trtllm_gateway.engine.protocol import EngineDeadError, EngineError, InvalidRequestError

logger = logging.getLogger(__name__)


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
            if one_request:
                logger.exception("TensorRT-LLM failed one request")
                raise TrtllmRequestError(f"TensorRT-LLM failed this request: {exc!r}") from exc
            self._on_dead(exc)
            raise EngineDeadError(f"TensorRT-LLM failed: {exc}") from exc
