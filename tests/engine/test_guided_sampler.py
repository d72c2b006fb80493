"""Sampler.prepare and RowMatcher on the real tokenizer: masks, bias, per-row failures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trtllm_gateway.engine.builtin.sampler import Sampler
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.guided.matcher import (
    GuidedFactory,
    RowMatcher,
    apply_bitmask,
    fill_bitmask,
)
from trtllm_gateway.engine.model_source import resolve_model
from trtllm_gateway.engine.protocol import GenerateRequest, GuidedDecoding, SamplingParams

VOCAB = 49152
EOS = (2,)


@pytest.fixture(scope="module")
def factory() -> GuidedFactory:
    model_dir: Path = resolve_model("default")
    return GuidedFactory(model_dir, VOCAB, EOS)


def _seq(rid: str, sp: SamplingParams, guided: RowMatcher | None = None) -> Sequence:
    seq = Sequence.from_request(
        GenerateRequest(rid, (1, 2, 3), sp), torch.Generator().manual_seed(0)
    )
    seq.guided = guided
    return seq


def _allowed(factory: GuidedFactory, m: RowMatcher) -> list[str]:
    logits = torch.zeros(1, VOCAB)
    apply_bitmask(logits, fill_bitmask([m], VOCAB, pin=False))
    ids = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    return sorted(factory.tokenizer().decode_str([i]) for i in ids)


def test_mask_allows_exactly_the_grammar(factory: GuidedFactory) -> None:
    m = factory.matcher(GuidedDecoding("regex", "(yes|no)"))
    assert _allowed(factory, m) == ["n", "no", "y", "ye", "yes"]


def test_sync_is_idempotent_and_waits_for_start_after(factory: GuidedFactory) -> None:
    tok = factory.tokenizer()
    marker = tok.tokenize_str("</think>")
    m = factory.matcher(GuidedDecoding("regex", "(yes|no)", start_after=tuple(marker)))
    prompt = [5, 6]
    thinking = tok.tokenize_str("hmm, let me think")
    ids = prompt + thinking
    m.sync(ids, len(prompt))
    assert not m.active and not m.masking
    ids += marker
    m.sync(ids, len(prompt))
    assert m.active and not m.done
    ids += tok.tokenize_str("yes")
    m.sync(ids, len(prompt))
    m.sync(ids, len(prompt))  # again: nothing new is fed (preemption, double calls)
    assert m.done and m.error is None


def test_invalid_token_is_an_error_of_that_row_only(factory: GuidedFactory) -> None:
    tok = factory.tokenizer()
    broken = factory.matcher(GuidedDecoding("regex", "(yes|no)"))
    good = factory.matcher(GuidedDecoding("regex", "(yes|no)"))
    seqs = [
        _seq("broken", SamplingParams(temperature=0.0), broken),
        _seq("good", SamplingParams(temperature=0.0), good),
        _seq("bias", SamplingParams(temperature=0.0, logit_bias=((VOCAB + 1, 5.0),))),
        _seq("plain", SamplingParams(temperature=0.0)),
    ]
    seqs[0].token_ids += tok.tokenize_str("maybe")  # not in the grammar
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    expected_plain = int(logits[3].argmax())
    results = Sampler(EOS).sample(logits, seqs).resolve()
    assert results[0].error is not None and "constraint" in results[0].error
    assert results[1].error is None
    assert tok.decode_str([results[1].token_id]) in ["n", "no", "y", "ye", "yes"]
    # An out-of-range logit_bias id is refused where requests enter (check_token_ids, 400);
    # one that got past it still fails only its own row.
    assert results[2].error is not None
    assert results[3].error is None and results[3].token_id == expected_plain


def test_logit_bias_and_allowed_token_ids() -> None:
    logits = torch.zeros(3, VOCAB)
    logits[:, 10] = 5.0
    seqs = [
        _seq("plus", SamplingParams(temperature=0.0, logit_bias=((77, 100.0),))),
        _seq("minus", SamplingParams(temperature=0.0, logit_bias=((10, -100.0), (11, 1.0)))),
        _seq("allowed", SamplingParams(temperature=1.0, allowed_token_ids=(500, 501))),
    ]
    results = Sampler(EOS).sample(logits, seqs).resolve()
    assert [r.token_id for r in results[:2]] == [77, 11]
    assert results[2].token_id in (500, 501)


def test_out_of_range_output_token_is_a_row_error(factory: GuidedFactory) -> None:
    m = factory.matcher(GuidedDecoding("regex", "a+"))
    m.sync([1, -3], 1)  # e.g. a sibling's first token that never was a token
    assert m.error is not None and not m.masking and not m.done
