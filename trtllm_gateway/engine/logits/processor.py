"""The logits-processor interface: per-request state, one batch-level call per engine step.

A processor class is named at start-up by import path (`--logits-processor module:Class`) and
built once per engine with a ProcessorContext. For every request the engine calls
`new_state(prompt_token_ids, args)`; `args` are the request's `vllm_xargs` (vLLM's extension
field, which vLLM hands to its own logits processors as SamplingParams.extra_args). A processor
that returns None leaves the request alone, so requests select processors through their args.
Whatever a processor raises fails that one request, never the engine: ValueError, TypeError or
LookupError in `new_state` refuses it (a 400 naming `vllm_xargs`: the client's arguments), any
other exception there or in `apply` is the processor's bug (a 500). Check the arguments in
`new_state`: an id past the vocabulary that reaches `apply` indexes past the logits, which on
CUDA is a device-side assert that takes the whole engine down, not an exception. At each step
that samples a token, `apply(logits, rows)` gets the rows of the requests it holds state for,
in one call:

    class Ban(LogitsProcessor[int]):
        def new_state(self, prompt_token_ids, args):
            if "ban" not in args:
                return None
            ban = args["ban"]
            if type(ban) is not int or not 0 <= ban < self.context.vocab_size:
                raise ValueError(f"ban must be a token id in [0, {self.context.vocab_size})")
            return ban

        def apply(self, logits, rows):
            for i, row in enumerate(rows):
                logits[i, row.state] = float("-inf")

`logits` is float32 [len(rows), vocab] on the engine's device; modify it in place. It is the
model's output before anything else of sampling (penalties, logit_bias, grammars, temperature),
as TensorRT-LLM runs its logits post-processors straight after the forward pass
(PyTorchModelEngine._execute_logit_post_processors); logprobs stay the model's raw ones.

Engines differ in one way a processor can see. The built-in engine calls `apply` once per step
with every row it holds state for. TensorRT-LLM calls its hook once per request and step
(`LogitsProcessor.__call__(req_id, logits, token_ids, stream_ptr, client_id)`), and pickles the
hook into its executor worker, so there `rows` has one row and the processor must be picklable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import torch

# What vllm_xargs may hold (vLLM's ChatCompletionRequest.vllm_xargs): strings and numbers, or
# lists of them.
XArg = str | int | float | list[str | int | float]
ExtraArgs = Mapping[str, XArg]

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class ProcessorContext:
    """What a processor may need to know of the engine it runs in."""

    vocab_size: int  # the logits' last dimension
    eos_token_ids: tuple[int, ...]
    tokenizer_dir: str  # a Hugging Face tokenizer directory (AutoTokenizer.from_pretrained)
    device: str  # where the logits live ("cpu", "cuda", "cuda:0")


@dataclass(frozen=True, slots=True)
class Row(Generic[S]):
    """One request's row in a step: its state and every token so far (prompt, then output)."""

    state: S
    token_ids: Sequence[int]
    prompt_len: int

    @property
    def output_ids(self) -> Sequence[int]:
        return self.token_ids[self.prompt_len :]


class LogitsProcessor(ABC, Generic[S]):
    """Subclass this; the engine builds one instance with `cls(context)`."""

    def __init__(self, context: ProcessorContext) -> None:
        self.context = context

    @abstractmethod
    def new_state(self, prompt_token_ids: Sequence[int], args: ExtraArgs) -> S | None:
        """A request arrives: its state, or None to leave it alone. ValueError (TypeError,
        LookupError) refuses it as the client's fault; check ids against the vocabulary here."""

    @abstractmethod
    def apply(self, logits: torch.Tensor, rows: Sequence[Row[S]]) -> None:
        """Modify logits [len(rows), vocab] in place; rows[i] is the request of row i.

        A state is the request's own and lives as long as it does: mutate it to keep count.
        An exception fails the requests of these rows (a 500), not the engine.
        """
