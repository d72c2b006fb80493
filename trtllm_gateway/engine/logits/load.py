"""LogitsProcessors: the processor classes named at start-up, built and applied by an engine.

Import paths are `package.module:Class` (or `package.module.Class`, as vLLM's
--logits-processors takes them); each must name a LogitsProcessor subclass. A request's bound
states are found once, at admission; a step applies each processor to the rows it holds state
for, in one call per processor.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trtllm_gateway.engine.logits.processor import (
    ExtraArgs,
    LogitsProcessor,
    ProcessorContext,
    Row,
)
from trtllm_gateway.engine.protocol import (
    InvalidRequestError,
    RequestFailedError,
    SamplingParams,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# What a processor raises on arguments it cannot take (`int(args["ban"])` on a list is a
# TypeError, a missing key a KeyError): the client's fault, a 400 naming vllm_xargs.
ARGUMENT_ERRORS = (ValueError, TypeError, LookupError)
TEST_PROCESSOR = "trtllm_gateway.engine.logits.hello_world:HelloWorldLogitsProcessor"
PARAM = "vllm_xargs"


def args_of(sampling: SamplingParams) -> ExtraArgs:
    """The request's vllm_xargs as the processors see them (lists as lists, as vLLM has them)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in sampling.extra_args}


def load_class(path: str) -> type[LogitsProcessor[Any]]:
    """The class at `module:Class` or `module.Class`; ValueError says what is wrong."""
    module_name, sep, name = path.partition(":")
    if not sep:
        module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise ValueError(f"logits processor {path!r}: expected module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"logits processor {path!r}: cannot import {module_name}: {e}") from e
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
        raise ValueError(
            f"logits processor {path!r}: {name} is not a subclass of "
            "trtllm_gateway.engine.logits.processor.LogitsProcessor"
        )
    return cls


@dataclass(frozen=True, slots=True)
class Bound:
    """One processor's state for one request."""

    processor: LogitsProcessor[Any]
    state: Any


class LogitsProcessors:
    def __init__(self, processors: Sequence[LogitsProcessor[Any]]) -> None:
        self.processors = tuple(processors)

    @classmethod
    def create(
        cls, paths: Sequence[str], context: ProcessorContext, test_processor: bool = False
    ) -> LogitsProcessors:
        """Build each named class once; test_processor adds the seeds' HelloWorld processor on
        every request (NVIDIA Dynamo's DYNAMO_ENABLE_TEST_LOGITS_PROCESSOR)."""
        built: list[LogitsProcessor[Any]] = [load_class(p)(context) for p in paths]
        if test_processor:
            from trtllm_gateway.engine.logits.hello_world import HelloWorldLogitsProcessor

            built.append(HelloWorldLogitsProcessor(context, every_request=True))
        return cls(built)

    def __bool__(self) -> bool:
        return bool(self.processors)

    def bind(self, prompt_token_ids: Sequence[int], args: ExtraArgs) -> tuple[Bound, ...]:
        """The states a new request gets. Whatever a processor raises fails this request only:
        ValueError, TypeError or LookupError (its arguments) is an InvalidRequestError (400),
        anything else the processor's own bug, a RequestFailedError (500)."""
        bound: list[Bound] = []
        for p in self.processors:
            name = type(p).__name__
            try:
                state = p.new_state(prompt_token_ids, args)
            except ARGUMENT_ERRORS as e:
                why = str(e) or type(e).__name__
                raise InvalidRequestError(
                    f"{name} refused vllm_xargs: {type(e).__name__}: {why}", param=PARAM
                ) from None
            except Exception as e:
                logger.exception("logits processor %s failed to set up a request", name)
                raise RequestFailedError(
                    f"logits processor {name} failed: {type(e).__name__}: {e}"
                ) from None
            if state is not None:
                bound.append(Bound(p, state))
        return tuple(bound)


def apply_bound(
    logits: torch.Tensor, rows: Sequence[tuple[tuple[Bound, ...], Sequence[int], int]]
) -> dict[int, str]:
    """Apply every processor to its rows of `logits` [len(rows), vocab], in place.

    rows[i]: (the request's bound states, its token ids, its prompt length). Returns the rows
    whose processor raised (row -> why); their logits are undefined and their tokens void.
    """
    groups: dict[int, tuple[LogitsProcessor[Any], list[tuple[int, Row[Any]]]]] = {}
    for i, (bound, token_ids, prompt_len) in enumerate(rows):
        for b in bound:
            entry = groups.setdefault(id(b.processor), (b.processor, []))
            entry[1].append((i, Row(b.state, token_ids, prompt_len)))
    failed: dict[int, str] = {}
    for processor, pairs in groups.values():
        live = [(i, row) for i, row in pairs if i not in failed]
        if not live:
            continue
        index = [i for i, _ in live]
        members = [row for _, row in live]
        whole = len(index) == logits.shape[0]  # every row, in order: work on logits itself
        sub = logits if whole else logits[index]  # advanced indexing copies; written back below
        try:
            processor.apply(sub, members)
        except Exception as e:  # the processor's own failure: its requests', not the batch's
            why = f"logits processor {type(processor).__name__} failed: {e or type(e).__name__}"
            failed.update(dict.fromkeys(index, why))
            continue
        if not whole:
            logits[index] = sub
    return failed
