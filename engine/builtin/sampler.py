"""Sampler: penalties, min_tokens, temperature/top-k/top-p/min-p, seeded draws, logprobs.

Logprobs are the model's raw log-softmax (vLLM's default raw_logprobs), taken before penalties
and temperature. On CPU every row draws from its own torch.Generator. On CUDA one Triton kernel
samples the whole batch (greedy or Gumbel-max) with Philox noise keyed by (request seed, output
step), and the ids reach the host by one non-blocking copy. Either way a seeded request samples
the same tokens whatever else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.builtin.sequence import Sequence
from engine.protocol import TokenLogprob


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: TokenLogprob | None


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
class PendingSample:
    """Sampled ids of one step on the device, on their way to a pinned host buffer."""

    token_ids: torch.Tensor  # [R] int64 on the device (feeds the next step's placeholders)
    host: torch.Tensor  # [R] int64, pinned
    ready: torch.cuda.Event | None
    raw_logprobs: torch.Tensor | None = None
    logprob_ks: list[int | None] = field(default_factory=list)

    def resolve(self) -> list[SampleResult]:
        if self.ready is not None:
            self.ready.synchronize()
        tokens = self.host.tolist()
        results = []
        for i, token in enumerate(tokens):
            k = self.logprob_ks[i] if self.logprob_ks else None
            lp = None
            if self.raw_logprobs is not None and k is not None:
                lp = logprob_entry(self.raw_logprobs[i], token, k)
            results.append(SampleResult(token, lp))
        return results


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...]) -> None:
        self.eos = eos_token_ids

    def sample_async(self, logits: torch.Tensor, seqs: list[Sequence]) -> PendingSample:
        """CUDA: sample every row in one kernel and start the copy of the ids to the host.

        Rows with penalties, min_tokens or top-k/top-p/min-p are adjusted first, row by row
        (penalties read seq.token_ids, so the stepper resolves placeholders before such steps).
        """
        from engine.builtin.kernels.sampling import row_key, sample

        want_lp = any(s.sampling.logprobs is not None for s in seqs)
        raw_lp = logits.log_softmax(-1) if want_lp else None
        temps: list[float] = []
        keys: list[int] = []
        for i, seq in enumerate(seqs):
            sp = seq.sampling
            greedy = _is_greedy(seq)
            if _needs_processing(seq):
                row = logits[i]
                _apply_penalties(row, seq)
                if seq.output_len < sp.min_tokens:
                    banned = [t for t in (*self.eos, *sp.stop_token_ids) if t < row.shape[0]]
                    row[banned] = float("-inf")
            temp = 0.0 if greedy else sp.temperature
            if not greedy and (sp.top_k > 0 or sp.top_p < 1.0 or sp.min_p > 0.0):
                logits[i] = _filter(logits[i] / sp.temperature, sp.top_k, sp.top_p, sp.min_p)
                temp = 1.0
            temps.append(temp)
            keys.append(row_key(seq.generator.initial_seed(), seq.output_len))
        dev = logits.device
        t_temps = torch.tensor(temps, dtype=torch.float32, pin_memory=True).to(
            dev, non_blocking=True
        )
        t_keys = torch.tensor(keys, dtype=torch.int64, pin_memory=True).to(dev, non_blocking=True)
        token_ids = sample(logits, t_temps, t_keys)
        host = torch.empty(len(seqs), dtype=torch.int64, pin_memory=True)
        host.copy_(token_ids, non_blocking=True)
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ready.record()
        ks = [s.sampling.logprobs for s in seqs] if want_lp else []
        return PendingSample(token_ids, host, ready, raw_lp, ks)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
        """logits: [len(seqs), vocab] float32, one row per sequence that samples this step."""
        if logits.is_cuda:
            return self.sample_async(logits, seqs).resolve()
        want_lp = any(s.sampling.logprobs is not None for s in seqs)
        raw_lp = logits.log_softmax(-1) if want_lp else None
        greedy_rows = [i for i, s in enumerate(seqs) if _is_greedy(s)]
        argmax = logits.argmax(-1).tolist() if greedy_rows else []
        results: list[SampleResult] = []
        for i, seq in enumerate(seqs):
            sp = seq.sampling
            row = logits[i]
            needs_processing = (
                sp.repetition_penalty != 1.0
                or sp.presence_penalty
                or sp.frequency_penalty
                or seq.output_len < sp.min_tokens
            )
            if needs_processing:
                row = row.clone()
                _apply_penalties(row, seq)
                if seq.output_len < sp.min_tokens:
                    banned = [t for t in (*self.eos, *sp.stop_token_ids) if t < row.shape[0]]
                    row[banned] = float("-inf")
            if _is_greedy(seq):
                token = int(row.argmax()) if needs_processing else argmax[i]
            else:
                row = _filter(row / sp.temperature, sp.top_k, sp.top_p, sp.min_p)
                probs = row.softmax(-1)
                if bool(torch.isfinite(probs).all()) and float(probs.sum()) > 0:
                    token = int(torch.multinomial(probs, 1, generator=seq.generator))
                else:  # a degenerate distribution (e.g. every token penalized to -inf)
                    token = int(torch.nan_to_num(row, nan=float("-inf")).argmax())
            lp = None
            if raw_lp is not None and sp.logprobs is not None:
                lp = logprob_entry(raw_lp[i], token, sp.logprobs)
            results.append(SampleResult(token, lp))
        return results


def _needs_processing(seq: Sequence) -> bool:
    sp = seq.sampling
    return bool(
        sp.repetition_penalty != 1.0
        or sp.presence_penalty
        or sp.frequency_penalty
        or seq.output_len < sp.min_tokens
    )


SAMPLING_EPS = 1e-5  # temperatures below this sample greedily, as in vLLM


def _is_greedy(seq: Sequence) -> bool:
    return seq.sampling.temperature < SAMPLING_EPS or seq.sampling.top_k == 1


def logprob_entry(lp_row: torch.Tensor, token: int, k: int) -> TokenLogprob:
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        vals, ids = lp_row.topk(k)
        top = tuple(zip(ids.tolist(), vals.tolist(), strict=True))
    return TokenLogprob(token, float(lp_row[token]), top)
