"""Sampler: logits processors, penalties, logit_bias, allowed ids, grammar masks, min_tokens,
temperature/top-k/top-p/min-p, seeded draws, logprobs.

The logits processors (engine/logits) see the model's logits first, as TensorRT-LLM's logits
post-processors do. A request whose adjustments fail (a constraint in error, its logits
processor raising) is reported failed on its own row; the rest of the batch samples
as if it were not there. A processor's failure is its own bug, not the request's (`internal`:
a 500, where the request's own inputs are a 400). Grammar masks (engine.guided) are built on the
host for every constrained row and applied to the batch in one op; logprobs stay the model's raw
ones, before any processor, mask or bias.

One contract on every device: sample() gives a PendingSample, resolve() its SampleResults.
Logprobs are the model's raw log-softmax (vLLM's default raw_logprobs), taken before penalties
and temperature. On CPU every row draws from its own torch.Generator and the pending sample is
resolved when it is made. On CUDA one Triton kernel samples the whole batch (greedy or
Gumbel-max) with Philox noise keyed by (request seed, output step), and the ids reach the host by
one non-blocking copy that resolve() waits for. Either way a seeded request samples the same
tokens whatever else shares the batch.

A step whose rows all draw straight from the model's logits (Sequence.draws_raw: most steps of
most servers) gets its Draws before the forward: the kernel's keys and temperatures. A decode
graph that samples inside itself (cuda_graph.py) takes them and leaves the ids in Draws.ids;
sample() then only copies them down. That saves the two kernel launches from Python, ~80 us
each on a busy serving host (docs/benchmarks.md), and the step's sampling is the same kernel
on the same inputs either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from trtllm_gateway.engine.builtin.pinned_ring import HostSlots, PinnedRing
from trtllm_gateway.engine.builtin.sample_keys import row_keys
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.guided.compile import DEFAULT_PARAMS
from trtllm_gateway.engine.guided.matcher import RowMatcher, apply_bitmask, fill_bitmask
from trtllm_gateway.engine.logits.load import apply_bound
from trtllm_gateway.engine.protocol import (
    InvalidRequestError,
    RequestFailedError,
    TokenLogprob,
)


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: TokenLogprob | None
    error: str | None = None  # this row failed (its token is meaningless)
    internal: bool = False  # ... by the engine's fault (a logits processor's bug), not its own


def _apply_penalties(logits: torch.Tensor, seq: Sequence) -> None:
    sp = seq.sampling
    if sp.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(
            vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty
        )
    if (sp.presence_penalty or sp.frequency_penalty) and seq.output_len:
        out = torch.tensor(seq.output_ids, dtype=torch.long, device=logits.device)
        counts = torch.zeros_like(logits).index_add_(
            0, out, torch.ones_like(out, dtype=logits.dtype)
        )
        logits -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0).to(
            logits.dtype
        )


def row_failure(
    seq: Sequence, why: str, internal: bool = False
) -> InvalidRequestError | RequestFailedError:
    """One request's failure in a step: its own inputs' (a constraint in error names the param
    it came from), or, internal, the engine's (a logits processor's bug: a 500, not a 400)."""
    if internal:
        return RequestFailedError(why)
    g, guided = seq.guided, seq.sampling.guided
    if g is not None and g.error is not None and guided is not None:
        return InvalidRequestError(why, param=DEFAULT_PARAMS[guided.kind])
    return InvalidRequestError(why)


def _adjust_row(row: torch.Tensor, seq: Sequence, eos: tuple[int, ...]) -> None:
    """Penalties, logit_bias, allowed_token_ids and the min_tokens ban, in place on one row."""
    sp = seq.sampling
    vocab = row.shape[0]
    _apply_penalties(row, seq)
    if sp.logit_bias:  # every id checked once, at admission (sequence_builder.check_request_ids)
        ids = [t for t, _ in sp.logit_bias]
        bias = torch.tensor([b for _, b in sp.logit_bias], dtype=row.dtype)
        row.index_add_(0, torch.tensor(ids, device=row.device), bias.to(row.device))
    if sp.allowed_token_ids is not None:
        allowed = list(sp.allowed_token_ids)
        keep = row[allowed].clone()
        row.fill_(float("-inf"))
        row[allowed] = keep
    if seq.output_len < sp.min_tokens:
        row[[t for t in (*eos, *sp.stop_token_ids) if t < vocab]] = float("-inf")


def _filter(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        drop[0] = False  # and always the most likely one (top_p = 0 means greedy)
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, idx, drop), float("-inf"))
    return logits


@dataclass(slots=True)
class Draws:
    """A step's draws when every row takes the model's logits as they are: the sampling
    kernel's keys [0, 8n) and temperatures [8n, 12n) packed as bytes (None: every row greedy,
    all zeros). A backend that sampled the rows itself sets ids ([n] int64 on its device)."""

    packed: np.ndarray | None
    ids: torch.Tensor | None = None


@dataclass(slots=True)
class PendingSample:
    """One step's sampled ids: on CUDA on their way to a pinned host buffer, on CPU already there.

    resolve() waits for them (a no-op on CPU) and gives one SampleResult per row.
    """

    token_ids: torch.Tensor  # [R] int64 on the device (the next step's placeholders read it)
    host: torch.Tensor  # [R] int64 on the host (pinned on CUDA; token_ids itself on CPU)
    ready: torch.cuda.Event | None  # None: the ids are on the host already
    raw_logprobs: torch.Tensor | None = None
    logprob_ks: list[int | None] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # row -> why
    internal: set[int] = field(default_factory=set)  # failed rows that are the engine's fault

    @property
    def bare(self) -> bool:
        """Tokens only: no row failed and none asked for logprobs (tokens() says it all)."""
        return not self.failed and self.raw_logprobs is None

    def tokens(self) -> list[int]:
        """The sampled ids, once they are on the host."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()

    def resolve(self) -> list[SampleResult]:
        tokens = self.tokens()
        if self.bare:
            return [SampleResult(token, None) for token in tokens]
        results = []
        for i, token in enumerate(tokens):
            if i in self.failed:
                results.append(SampleResult(-1, None, self.failed[i], i in self.internal))
                continue
            k = self.logprob_ks[i] if self.logprob_ks else None
            lp = None
            if self.raw_logprobs is not None and k is not None:
                lp = logprob_entry(self.raw_logprobs[i], token, k)
            results.append(SampleResult(token, lp))
        return results


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...]) -> None:
        self.eos = eos_token_ids
        self._up: PinnedRing | None = None  # CUDA: temperatures and keys go up through it
        self._down = HostSlots()  # ... and the sampled ids come down into these
        self._zeros: torch.Tensor | None = None  # CUDA: an all-greedy step's (never written)

    @torch.inference_mode()
    def prepare(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> tuple[dict[int, str], set[int]]:
        """Apply every per-row adjustment and the grammar masks to logits in place.

        Returns the rows that failed (row -> message), and those of them whose logits processor
        raised (the engine's fault); their logits are left harmless (zeros) and their tokens
        must be ignored. Nothing a single request asks for fails another row.
        """
        special = [i for i, s in enumerate(seqs) if not s.plain]  # most rows: nothing to do
        failed = _apply_processors(logits, seqs, [seqs[i] for i in special])
        internal = set(failed)
        masked: list[RowMatcher] = []
        rows: list[int] = []
        for i in special:
            seq = seqs[i]
            g = seq.guided
            if g is None and i not in failed and not _needs_processing(seq):
                continue
            if i in failed:
                logits[i] = 0.0
                continue
            try:
                if _needs_processing(seq):
                    _adjust_row(logits[i], seq, self.eos)
                if g is not None:
                    g.sync(seq.token_ids, seq.prompt_len)
                    if g.error is not None:
                        raise ValueError(f"constraint failed: {g.error}")
            except Exception as e:  # this request's own inputs; never the batch's problem
                failed[i] = str(e) or type(e).__name__
                logits[i] = 0.0
                continue
            if g is not None and g.masking:
                masked.append(g)
                rows.append(i)
        if masked:
            mask = fill_bitmask(masked, logits.shape[1], pin=logits.is_cuda)
            apply_bitmask(logits, mask, None if len(rows) == len(seqs) else rows)
        return failed, internal

    def draws(
        self,
        seqs: list[Sequence] | tuple[Sequence, ...],
        raw: bool | None = None,
        drawn: list[int] | None = None,
    ) -> Draws | None:
        """The step's Draws when every row draws straight from the logits, else None. raw and
        drawn: what the rows say (all Sequence.draws_raw; the rows not greedy) when the caller
        has it already (a steady decode run keeps it: scheduler.DecodeRows)."""
        if not (all(s.draws_raw for s in seqs) if raw is None else raw):
            return None
        if drawn is None:
            drawn = [i for i, s in enumerate(seqs) if not s.greedy]
        return Draws(_draw_inputs(seqs, drawn) if drawn else None)

    @torch.inference_mode()
    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], draws: Draws | None = None
    ) -> PendingSample:
        """logits: [len(seqs), vocab] float32 (or a decode graph's 16-bit logits), one row per
        sequence that samples this step. draws: the step's Draws (Sampler.draws) if it has
        them; when the backend sampled the rows (draws.ids), they are only copied down.

        Rows with penalties, bias, constraints, min_tokens or top-k/top-p/min-p are adjusted
        first (penalties and constraints read seq.token_ids, so the step pipeline resolves
        placeholders before such steps). A failed row samples from zeroed logits (token 0, a
        valid id for a step already scheduled behind it) and resolves to its error.
        """
        if draws is not None and draws.ids is not None:
            host, ready = self._down.download(draws.ids, BLOCKING_WAIT)
            return PendingSample(draws.ids, host, ready)
        if logits.dtype != torch.float32 and draws is None and not all(s.draws_raw for s in seqs):
            # A decode graph's 16-bit logits: adjusted, filtered or read for logprobs in float,
            # as eager steps' are (compute_logits); rows that only draw read them as they are.
            logits = logits.float()
        want_lp = any(s.sampling.logprobs is not None for s in seqs if not s.plain)
        raw_lp = logits.log_softmax(-1) if want_lp else None
        failed, internal = self.prepare(logits, seqs)
        ks = [s.sampling.logprobs for s in seqs] if want_lp else []
        if logits.is_cuda:
            if self._up is None or self._up.device != logits.device:
                self._up = PinnedRing(logits.device)
            packed = draws.packed if draws is not None else None
            token_ids = _draw_on_device(logits, seqs, failed, self._up, self._zeros_of, packed)
            host, ready = self._down.download(token_ids, BLOCKING_WAIT)
            return PendingSample(token_ids, host, ready, raw_lp, ks, failed, internal)
        token_ids = _draw_on_host(logits, seqs, failed)
        return PendingSample(token_ids, token_ids, None, raw_lp, ks, failed, internal)

    def _zeros_of(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A zeroed device buffer of at least nbytes, kept: an all-greedy step's temperatures
        (0: greedy) and keys (never read), with no upload."""
        z = self._zeros
        if z is None or z.numel() < nbytes or z.device != device:
            z = self._zeros = torch.zeros(
                max(2 * nbytes, 1 << 12), dtype=torch.uint8, device=device
            )
        return z


def _draw_on_device(
    logits: torch.Tensor,
    seqs: list[Sequence],
    failed: dict[int, str],
    ring: PinnedRing,
    zeros: Callable[[int, torch.device], torch.Tensor],
    packed: np.ndarray | None = None,
) -> torch.Tensor:
    """CUDA: every row in one kernel (greedy or Gumbel-max), Philox noise keyed by (seed, step).
    A step whose rows are all greedy uploads nothing: its temperatures and keys are zeros kept
    on the device (`zeros`), where an upload a step was ~4% of a serving core's main thread
    (135M at 256 running, greedy, py-spy on an H200, 2026-11-28)."""
    from trtllm_gateway.engine.builtin.kernels.sampling import sample

    n = len(seqs)
    drawn = (
        []
        if packed is not None
        else [i for i, seq in enumerate(seqs) if not seq.greedy and i not in failed]
    )
    if packed is not None:  # the step's Draws: every row takes the logits as they are
        dev = ring.upload(packed, torch.uint8)
    elif drawn:
        dev = ring.upload(_packed_inputs(logits, seqs, drawn), torch.uint8)
    else:
        dev = zeros(12 * n, logits.device)
    return sample(logits, dev[8 * n : 12 * n].view(torch.float32), dev[: 8 * n].view(torch.int64))


def _packed_inputs(logits: torch.Tensor, seqs: list[Sequence], drawn: list[int]) -> np.ndarray:
    """The sampled rows' keys and temperatures in one buffer, for one upload: keys [0, 8n)
    bytes, temperatures after; a greedy row's are zeros (its key is never read). A row with
    top-k / top-p / min-p has its logits filtered here and samples at temperature 1."""
    packed = _draw_inputs(seqs, drawn)
    temps = packed[8 * len(seqs) :].view(np.float32)
    for i in drawn:
        sp = seqs[i].sampling
        if sp.top_k > 0 or sp.top_p < 1.0 or sp.min_p > 0.0:
            logits[i] = _filter(logits[i] / sp.temperature, sp.top_k, sp.top_p, sp.min_p)
            temps[i] = 1.0
    return packed


def _draw_inputs(seqs: list[Sequence] | tuple[Sequence, ...], drawn: list[int]) -> np.ndarray:
    """The drawn rows' keys (the request seed hashed with its output step) and temperatures
    packed for one upload: keys [0, 8n) bytes, temperatures after; a greedy row's are zeros."""
    n = len(seqs)
    packed = np.zeros(12 * n, dtype=np.uint8)
    rows = [seqs[i] for i in drawn]
    packed[8 * n :].view(np.float32)[drawn] = [s.sampling.temperature for s in rows]
    seeds = np.fromiter((s.seed for s in rows), np.uint64, len(rows))
    steps = np.fromiter((len(s.token_ids) - s.prompt_len for s in rows), np.uint64, len(rows))
    packed[: 8 * n].view(np.int64)[drawn] = row_keys(seeds, steps)
    return packed


def _draw_on_host(
    logits: torch.Tensor, seqs: list[Sequence], failed: dict[int, str]
) -> torch.Tensor:
    """CPU: greedy rows by argmax, the others from their own seeded torch.Generator."""
    token_ids = logits.argmax(-1)
    for i, seq in enumerate(seqs):
        if i in failed or seq.greedy:
            continue
        sp = seq.sampling
        row = _filter(logits[i] / sp.temperature, sp.top_k, sp.top_p, sp.min_p)
        probs = row.softmax(-1)
        if bool(torch.isfinite(probs).all()) and float(probs.sum()) > 0:
            token_ids[i] = torch.multinomial(probs, 1, generator=seq.generator)[0]
        else:  # a degenerate distribution (e.g. every token penalized to -inf)
            token_ids[i] = torch.nan_to_num(row, nan=float("-inf")).argmax()
    return token_ids


def _apply_processors(
    logits: torch.Tensor, seqs: list[Sequence], special: list[Sequence]
) -> dict[int, str]:
    """The logits processors first, on the model's own logits (engine/logits/processor.py).
    Only a row that is not plain (`special`) can hold one."""
    if not any(s.logits_bound for s in special):
        return {}
    return apply_bound(logits, [(s.logits_bound, s.token_ids, s.prompt_len) for s in seqs])


def _needs_processing(seq: Sequence) -> bool:
    """Penalties, logit_bias, allowed ids (seq.row_rules), or min_tokens not reached yet."""
    return seq.row_rules or len(seq.token_ids) - seq.prompt_len < seq.sampling.min_tokens


# resolve() waits on a blocking-sync event (cudaEventBlockingSync): the core's thread sleeps until
# the step's ids are copied instead of spinning a CPU core in cudaEventSynchronize, which had the
# core process at 100% of a core whatever its host work was (issue 39, item 2). bench.offline
# --spin-wait sets it False for the A/B.
BLOCKING_WAIT = True


def logprob_entry(lp_row: torch.Tensor, token: int, k: int) -> TokenLogprob:
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        vals, ids = lp_row.topk(k)
        top = tuple(zip(ids.tolist(), vals.tolist(), strict=True))
    return TokenLogprob(token, float(lp_row[token]), top)
