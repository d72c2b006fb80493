"""Sampler on the CPU with tiny logits: what it pins.

- greedy (temperature 0, or top_k 1) is the argmax of the adjusted logits;
- the filters: top-k keeps the k best, top-p the smallest head whose mass reaches p (the token
  that crosses p included), min-p the tokens with at least min_p times the best probability;
- seeds: a row draws only from its own generator, so the same seed gives the same tokens, and a
  row's tokens do not depend on what else shares the batch;
- logprobs: the model's raw log-softmax (before bias, penalties and temperature), the chosen
  token's plus k alternatives best first, none for k = 0;
- adjustments: repetition penalty (over prompt and output), presence and frequency penalties
  (over the output only), logit_bias, allowed_token_ids, and min_tokens banning EOS and stop ids;
- a row whose own inputs fail (its constraint in error) fails alone.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trtllm_gateway.engine.builtin.sampler import Draws, Sampler, SampleResult
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.protocol import SamplingParams

EOS = 0
VOCAB = 8


def _seq(sp: SamplingParams, seed: int = 0, output: tuple[int, ...] = ()) -> Sequence:
    prompt = [5, 6]
    return Sequence(
        request_id="r",
        token_ids=[*prompt, *output],
        prompt_len=len(prompt),
        sampling=sp,
        generator=torch.Generator().manual_seed(seed),
    )


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
    """One step's rows through the sampler's one contract: sample, then resolve."""
    return Sampler((EOS,)).sample(logits, seqs).resolve()


def _probs_logits(*probs: float) -> torch.Tensor:
    """One row of logits whose softmax is `probs` (padded with near-zero mass to VOCAB)."""
    row = torch.full((VOCAB,), -30.0)
    row[: len(probs)] = torch.tensor([math.log(p) for p in probs])
    return row


def _draws(sp: SamplingParams, row: torch.Tensor, n: int = 300, seed: int = 0) -> list[int]:
    """n tokens drawn one step at a time by one sequence (its generator advances)."""
    sampler, seq = Sampler((EOS,)), _seq(sp, seed)
    return [sampler.sample(row.clone().unsqueeze(0), [seq]).resolve()[0].token_id for _ in range(n)]


def test_greedy_is_the_argmax() -> None:
    logits = torch.tensor([[0.1, 2.0, 0.3, 1.9, 0, 0, 0, 0], [5.0, 0, 0, 0, 0, 0, 0, 6.0]])
    seqs = [_seq(SamplingParams(temperature=0.0)), _seq(SamplingParams(top_k=1))]
    assert [r.token_id for r in sample(logits, seqs)] == [1, 7]


def test_top_k_keeps_the_k_best() -> None:
    row = _probs_logits(0.3, 0.25, 0.2, 0.15, 0.1)
    assert set(_draws(SamplingParams(top_k=2), row)) == {0, 1}
    assert set(_draws(SamplingParams(top_k=4), row)) == {0, 1, 2, 3}


def test_top_p_keeps_the_head_that_reaches_p() -> None:
    row = _probs_logits(0.5, 0.3, 0.15, 0.05)
    assert set(_draws(SamplingParams(top_p=0.4), row)) == {0}
    assert set(_draws(SamplingParams(top_p=0.6), row)) == {0, 1}  # 0.5 < 0.6: token 1 crosses
    assert set(_draws(SamplingParams(top_p=0.9), row)) == {0, 1, 2}
    assert set(_draws(SamplingParams(top_p=0.0), row, n=20)) == {0}


def test_min_p_keeps_tokens_near_the_best() -> None:
    row = _probs_logits(0.5, 0.3, 0.15, 0.05)
    assert set(_draws(SamplingParams(min_p=0.5), row)) == {0, 1}  # p >= 0.25
    assert set(_draws(SamplingParams(min_p=0.2), row)) == {0, 1, 2}  # p >= 0.1


def test_temperature_flattens_and_sharpens() -> None:
    row = torch.tensor([math.log(0.6), math.log(0.4)])  # a two-token vocabulary
    hot = _draws(SamplingParams(temperature=100.0), row, n=400)
    cold = _draws(SamplingParams(temperature=0.05), row, n=400)
    assert 120 < hot.count(1) < 280  # near 50/50
    assert cold.count(1) < 5  # (0.4/0.6)**20: almost never


def test_a_seed_reproduces_its_tokens_whatever_shares_the_batch() -> None:
    row = torch.zeros(VOCAB)  # uniform: every draw depends on the generator only
    sp = SamplingParams(temperature=1.0)
    alone = _draws(sp, row, n=30, seed=7)
    assert alone == _draws(sp, row, n=30, seed=7)
    assert alone != _draws(sp, row, n=30, seed=8)
    sampler = Sampler((EOS,))
    seqs = [_seq(sp, seed=1), _seq(sp, seed=7), _seq(sp, seed=2)]
    batched = [sampler.sample(torch.zeros(3, VOCAB), seqs).resolve()[1].token_id for _ in range(30)]
    assert batched == alone


def test_logprobs_are_raw_with_k_alternatives_best_first() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, 0, 0, 0, 0]] * 3)
    raw = logits[0].log_softmax(-1)
    seqs = [
        _seq(SamplingParams(temperature=0.0, logprobs=2, logit_bias=((2, 50.0),))),
        _seq(SamplingParams(temperature=0.0, logprobs=0)),
        _seq(SamplingParams(temperature=0.0)),
    ]
    biased, zero, off = sample(logits, seqs)
    assert biased.token_id == 2 and biased.logprob is not None
    assert biased.logprob.token_id == 2
    assert biased.logprob.logprob == pytest.approx(float(raw[2]))  # before the bias
    assert [t for t, _ in biased.logprob.top] == [1, 3]
    assert [v for _, v in biased.logprob.top] == pytest.approx([float(raw[1]), float(raw[3])])
    assert zero.logprob is not None and zero.logprob.top == ()
    assert zero.logprob.logprob == pytest.approx(float(raw[1]))
    assert off.logprob is None


def test_repetition_penalty_covers_prompt_and_output() -> None:
    # Token 5 is in the prompt; dividing its logit by 4 puts it under token 1.
    logits = torch.tensor([[0.0, 1.5, 0, 0, 0, 4.0, -1.0, 0]])
    plain = sample(logits.clone(), [_seq(SamplingParams(temperature=0.0))])
    sp = SamplingParams(temperature=0.0, repetition_penalty=4.0)
    assert plain[0].token_id == 5
    assert sample(logits.clone(), [_seq(sp)])[0].token_id == 1
    # A negative logit is multiplied: token 6 (prompt) falls under token 7 (unseen, 0 -> 0).
    neg = torch.tensor([[-9.0, -9.0, -9.0, -9.0, -9.0, -9.0, -0.5, -1.0]])
    assert sample(neg, [_seq(sp)])[0].token_id == 7


def test_presence_and_frequency_penalties_count_output_tokens() -> None:
    logits = torch.tensor([[0.0, 0, 3.0, 2.5, 0, 0, 0, 0]])
    # Token 2 was generated twice: frequency 0.3 * 2 = 0.6 puts it under token 3.
    freq = _seq(SamplingParams(temperature=0.0, frequency_penalty=0.3), output=(2, 2))
    assert sample(logits.clone(), [freq])[0].token_id == 3
    once = _seq(SamplingParams(temperature=0.0, frequency_penalty=0.3), output=(2,))
    assert sample(logits.clone(), [once])[0].token_id == 2
    pres = _seq(SamplingParams(temperature=0.0, presence_penalty=0.6), output=(2,))
    assert sample(logits.clone(), [pres])[0].token_id == 3
    # Prompt tokens are not output: token 5 in the prompt is not penalized.
    prompt_only = torch.tensor([[0.0, 0, 0, 0, 0, 3.0, 0, 0]])
    seq = _seq(SamplingParams(temperature=0.0, presence_penalty=5.0), output=(1,))
    assert sample(prompt_only, [seq])[0].token_id == 5


def test_logit_bias_and_allowed_token_ids() -> None:
    logits = torch.tensor([[0.0, 5.0, 0, 0, 0, 0, 0, 0]] * 2)
    seqs = [
        _seq(SamplingParams(temperature=0.0, logit_bias=((1, -100.0), (4, 1.0)))),
        _seq(SamplingParams(temperature=0.0, allowed_token_ids=(3, 6))),
    ]
    bias, allowed = sample(logits, seqs)
    assert bias.token_id == 4
    assert allowed.token_id in (3, 6)
    assert set(_draws(SamplingParams(allowed_token_ids=(3, 6)), torch.zeros(VOCAB))) == {3, 6}


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    logits = torch.tensor([[9.0, 0, 8.0, 1.0, 0, 0, 0, 0]])
    sp = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(2,))
    early = _seq(sp, output=(4,))
    assert sample(logits.clone(), [early])[0].token_id == 3
    done = _seq(sp, output=(4, 4))
    assert sample(logits.clone(), [done])[0].token_id == EOS


class _FailedConstraint:
    """A RowMatcher (engine/guided/matcher.py) whose grammar is in error."""

    error = "no token fits the grammar"
    masking = False

    def sync(self, token_ids: list[int], prompt_len: int) -> None:
        pass


def test_a_bad_row_fails_alone() -> None:
    logits = torch.tensor([[0.0, 5.0, 0, 0, 0, 0, 0, 0]] * 2)
    seqs = [_seq(SamplingParams(temperature=0.0)), _seq(SamplingParams(temperature=0.0))]
    seqs[0].guided = _FailedConstraint()  # type: ignore[assignment]  # a stand-in RowMatcher
    bad, good = sample(logits, seqs)
    assert bad.error == "constraint failed: no token fits the grammar"
    assert good.error is None and good.token_id == 1


@pytest.mark.parametrize(
    ("sp", "widened"),
    [
        (SamplingParams(temperature=0.0), False),  # greedy: the argmax of 16-bit logits
        (SamplingParams(temperature=0.8), False),  # temperature alone: a plain draw
        (SamplingParams(temperature=0.8, top_p=0.9), True),  # a filter
        (SamplingParams(temperature=0.8, top_k=3), True),
        (SamplingParams(temperature=0.0, logprobs=2), True),  # logprobs read them
        (SamplingParams(temperature=0.0, repetition_penalty=1.2), True),  # an adjustment
    ],
)
def test_16_bit_logits_are_widened_only_for_rows_that_adjust_or_read_them(
    sp: SamplingParams, widened: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode graph hands the sampler its logits in the model's dtype (cuda_graph.py): rows
    that only draw take them as they are; any row that filters, adjusts or reads them for
    logprobs makes the step widen them to float first, as an eager step's are. A plain greedy
    row beside such a row draws from the widened logits too, the same argmax."""
    from trtllm_gateway.engine.builtin import sampler as sampler_mod

    seen: list[torch.dtype] = []
    draw = sampler_mod._draw_on_host

    def spy(logits: torch.Tensor, seqs: list[Sequence], failed: dict[int, str]) -> torch.Tensor:
        seen.append(logits.dtype)
        return draw(logits, seqs, failed)

    monkeypatch.setattr(sampler_mod, "_draw_on_host", spy)
    logits = torch.tensor([[0.1, 2.0, 0.3, 1.9, 0, 0, 0, 0]] * 2).to(torch.bfloat16)
    seqs = [_seq(SamplingParams(temperature=0.0)), _seq(sp)]
    for seq in seqs:
        seq.settle()
    results = Sampler((EOS,)).sample(logits, seqs).resolve()
    assert seen == [torch.float32 if widened else torch.bfloat16]
    assert results[0].token_id == 1
    if sp.logprobs is not None:
        lp = results[1].logprob
        assert lp is not None and lp.logprob == pytest.approx(
            float(torch.log_softmax(logits[1].float(), -1)[lp.token_id])
        )


def test_draws_pack_each_rows_key_and_temperature_when_every_row_draws_raw() -> None:
    """Sampler.draws: what a decode graph samples with (cuda_graph.py). Keys are the request
    seed hashed with its output step, as the eager launch computes them; a greedy row's are
    zeros; a step of greedy rows only packs nothing; a row that filters or adjusts its logits
    (top-p, a penalty) or reads them (logprobs) leaves the step to the sampler: no Draws."""
    from trtllm_gateway.engine.builtin.sample_keys import row_key

    sampler = Sampler((EOS,))
    greedy, hot = SamplingParams(temperature=0.0), SamplingParams(temperature=0.7)
    seqs = [_seq(greedy), _seq(hot, seed=3, output=(1, 2)), _seq(greedy), _seq(hot, seed=9)]
    for seq in seqs:
        seq.settle()
    draws = sampler.draws(seqs)
    assert draws is not None and draws.packed is not None and draws.ids is None
    n = len(seqs)
    keys = draws.packed[: 8 * n].view(np.int64).tolist()
    temps = draws.packed[8 * n :].view(np.float32).tolist()
    assert temps == [0.0, pytest.approx(0.7), 0.0, pytest.approx(0.7)]
    assert keys == [0, row_key(seqs[1].seed, 2), 0, row_key(seqs[3].seed, 0)]
    assert seqs[1].seed == 3 and seqs[3].seed == 9

    only_greedy = [_seq(greedy), _seq(greedy)]
    for seq in only_greedy:
        seq.settle()
    assert sampler.draws(only_greedy) == Draws(None)

    for other in (
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=0.0, logprobs=1),
        SamplingParams(temperature=0.0, presence_penalty=0.5),
    ):
        row = _seq(other)
        row.settle()
        assert sampler.draws([*only_greedy, row]) is None
