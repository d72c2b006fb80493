"""Sequence: the engine-side state of one request (tokens, KV blocks, progress, sampling RNG)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from trtllm_gateway.engine.guided.matcher import RowMatcher
from trtllm_gateway.engine.logits.load import Bound
from trtllm_gateway.engine.protocol import (
    FinishReason,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
)

SAMPLING_EPS = 1e-5  # temperatures below this sample greedily, as in vLLM


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Sequence:
    request_id: str
    token_ids: list[int]
    prompt_len: int
    sampling: SamplingParams
    generator: torch.Generator
    extra_key: bytes = b""  # mixed into block hashes (image hashes)
    images: tuple[object, ...] = ()
    # The images as placed in the expanded prompt: (hash, first position, positions), for the
    # KV events' per-block image info.
    mm_spans: tuple[tuple[str, int, int], ...] = ()
    status: Status = Status.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache
    num_cached: int = 0  # prompt tokens served from the prefix cache at first admission
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chain for full blocks
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs_done: bool = False
    first_event_sent: bool = False
    # Timings (perf_counter seconds) for metrics.
    arrival: float = field(default_factory=time.perf_counter)
    first_scheduled: float | None = None
    first_token: float | None = None
    preemptions: int = 0
    # Disaggregation: a prefill-side sequence keeps its KV blocks for a sibling to pull; a
    # decode-side sequence arrives with the sibling's prompt KV to write into its own blocks.
    hold_kv: bool = False
    kv_import: torch.Tensor | None = None
    # The transfer worker wrote the sibling's KV into block_table (reserved before the copy).
    kv_loaded: bool = False
    # The request's output constraint (response_format, structured_outputs), if any.
    guided: RowMatcher | None = None
    # The logits processors that hold state for this request (engine/logits), and those states.
    logits_bound: tuple[Bound, ...] = ()
    # block_table as an int32 array, with the list object and length it was built from.
    _table_array: tuple[list[int], int, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    # What the sampling parameters (never replaced) ask of every step, read once here rather
    # than attribute by attribute for each of hundreds of rows a step (issue 39, item 2).
    greedy: bool = field(default=False, init=False, repr=False, compare=False)
    penalized: bool = field(default=False, init=False, repr=False, compare=False)
    row_rules: bool = field(default=False, init=False, repr=False, compare=False)
    seed: int = field(default=0, init=False, repr=False, compare=False)  # generator's seed
    # Nothing a step does for this row goes beyond the common path (no images, prompt
    # logprobs, logprobs, constraint, logits processor, penalty, bias, allowed ids or
    # min_tokens): the per-row checks of a step skip it. Set by settle() at admission, when
    # all of those are known; False (every check made) until then.
    plain: bool = field(default=False, init=False, repr=False, compare=False)
    # Plain, and its draw needs nothing but a temperature (settle()).
    draws_raw: bool = field(default=False, init=False, repr=False, compare=False)
    # Outcomes' per-token fast path (set by Outcomes once a plain row's first event is out):
    # a token in stop_ids ends it, and so does reaching end_len tokens.
    streaming: bool = field(default=False, init=False, repr=False, compare=False)
    stop_ids: frozenset[int] = field(default=frozenset(), init=False, repr=False, compare=False)
    end_len: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sp = self.sampling
        self.greedy = sp.temperature < SAMPLING_EPS or sp.top_k == 1
        self.penalized = bool(
            sp.repetition_penalty != 1.0 or sp.presence_penalty or sp.frequency_penalty
        )
        self.row_rules = bool(self.penalized or sp.logit_bias or sp.allowed_token_ids is not None)
        self.seed = self.generator.initial_seed()

    def settle(self) -> None:
        """Admitted to run: what every step would ask of this row, read once (plain)."""
        sp = self.sampling
        self.plain = not (
            self.images
            or self.guided is not None
            or self.logits_bound
            or self.row_rules
            or sp.min_tokens > 0
            or sp.logprobs is not None
            or sp.prompt_logprobs is not None
        )
        # Drawn from the model's logits in their own dtype: nothing adjusts or filters them
        # (Sampler.sample widens 16-bit logits to float for a step with any other row).
        self.draws_raw = self.plain and (
            self.greedy or not (sp.top_k > 0 or sp.top_p < 1.0 or sp.min_p > 0.0)
        )

    @classmethod
    def from_request(cls, req: GenerateRequest, generator: torch.Generator) -> Sequence:
        extra = b"".join(img.hash.encode() for img in req.images)
        return cls(
            request_id=req.request_id,
            token_ids=list(req.prompt_token_ids),
            prompt_len=len(req.prompt_token_ids),
            sampling=req.sampling,
            generator=generator,
            extra_key=extra,
            images=tuple(img.payload for img in req.images),
        )

    def block_table_array(self) -> np.ndarray:
        """block_table as int32, rebuilt only when the list grows or is replaced: the CUDA path
        uploads every running sequence's table each step, and it changes once a block."""
        cached = self._table_array
        table = self.block_table
        # Holding the list keeps its identity unique, so `is` cannot match a new list.
        if cached is None or cached[0] is not table or cached[1] != len(table):
            cached = self._table_array = (table, len(table), np.asarray(table, dtype=np.int32))
        return cached[2]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
