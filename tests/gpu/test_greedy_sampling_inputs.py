"""An all-greedy step samples with no upload (sampler._draw_on_device): its temperatures and keys
are a zeroed device buffer the sampler keeps and never writes; a step with a sampled row still
uploads its own, and a greedy step after it reads zeros again."""

from __future__ import annotations

import torch

from tests.unit.test_sampler import EOS, _seq
from trtllm_gateway.engine.builtin.sampler import Sampler
from trtllm_gateway.engine.protocol import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def _step(sampler: Sampler, logits: torch.Tensor, params: list[SamplingParams]) -> list[int]:
    seqs = [_seq(sp) for sp in params]
    return [r.token_id for r in sampler.sample(logits, seqs).resolve()]


def test_greedy_steps_upload_nothing_and_sample_the_argmax() -> None:
    torch.manual_seed(0)
    sampler = Sampler((EOS,))
    logits = torch.randn(5, 3000, device="cuda")
    assert _step(sampler, logits.clone(), [GREEDY] * 5) == logits.argmax(-1).tolist()
    ring = sampler._up
    assert ring is not None and ring._next == 0  # the ring made, nothing sent through it
    zeros = sampler._zeros
    assert zeros is not None

    sampled = SamplingParams(temperature=1.0)
    mixed = [GREEDY, sampled, GREEDY, GREEDY, GREEDY]
    first = _step(sampler, logits.clone(), mixed)
    assert ring._next == 1  # the sampled row's step uploaded its temperatures and keys
    again = _step(sampler, logits.clone(), mixed)
    assert first == again  # the seeded row draws the same token from the same logits
    greedy_rows = [0, 2, 3, 4]
    assert [first[i] for i in greedy_rows] == logits.argmax(-1)[greedy_rows].tolist()

    wide = torch.randn(400, 3000, device="cuda")  # past the first buffer (4 KiB): it grows
    assert _step(sampler, wide.clone(), [GREEDY] * 400) == wide.argmax(-1).tolist()
    assert ring._next == 2
    assert sampler._zeros is not None and int(sampler._zeros.count_nonzero()) == 0
