"""TensorRT-LLM's exceptions -> EngineError subclasses, in one place for every call into it.

Its RequestError fails one request and the engine keeps serving; an exception the caller names
as the request's fault (generate_async's ValueError/TypeError) is an InvalidRequestError; any
other exception means TensorRT-LLM itself broke, so the engine is marked dead (health 503).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from trtllm_gateway.engine.protocol import EngineDeadError, EngineError, InvalidRequestError


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
    def translated(self, invalid: tuple[type[Exception], ...] = ()) -> Iterator[None]:
        """Run a call into TensorRT-LLM; what escapes it is an EngineError (or a cancellation,
        which passes untouched, as does an EngineError raised inside)."""
        try:
            yield
        except self._request_error as exc:
            raise TrtllmRequestError(str(exc)) from None
        except EngineError:
            raise
        except invalid as exc:
            raise InvalidRequestError(str(exc)) from None
        except Exception as exc:
            self._on_dead(exc)
            raise EngineDeadError(f"TensorRT-LLM failed: {exc}") from exc
