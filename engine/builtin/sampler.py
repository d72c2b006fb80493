"""Sampler: penalties, min_tokens, temperature/top-k/top-p/min-p, seeded draws, logprobs.

Logprobs are the model's raw log-softmax (vLLM's default raw_logprobs), taken before penalties
and temperature. Every row draws from its own torch.Generator, so a seeded request samples the
same tokens whatever else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, idx, drop), float("-inf"))
    return logits


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...]) -> None:
        self.eos = eos_token_ids

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
        """logits: [len(seqs), vocab] float32, one row per sequence that samples this step."""
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
                token = int(torch.multinomial(probs, 1, generator=seq.generator))
            lp = None
            if raw_lp is not None and sp.logprobs is not None:
                lp = logprob_entry(raw_lp[i], token, sp.logprobs)
            results.append(SampleResult(token, lp))
        return results


def _is_greedy(seq: Sequence) -> bool:
    return seq.sampling.temperature == 0.0 or seq.sampling.top_k == 1


def logprob_entry(lp_row: torch.Tensor, token: int, k: int) -> TokenLogprob:
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        vals, ids = lp_row.topk(k)
        top = tuple(zip(ids.tolist(), vals.tolist(), strict=True))
    return TokenLogprob(token, float(lp_row[token]), top)
