"""StepBatch.build: one packer for every backend, checked against a batch worked out by hand.

The CPU and the CUDA step run this same build on the same scheduled chunks (pipeline.py); only
the backend that consumes the batch differs. tests/gpu/test_step_path.py records the batches of
one workload on both devices and wants them equal.
"""

from __future__ import annotations

import numpy as np
import torch

from trtllm_gateway.engine.builtin.scheduler import ScheduledChunk
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.step_batch import StepBatch
from trtllm_gateway.engine.builtin.vision.placeholders import PlacedImage
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams

BS = 4  # tokens per block


def seq(
    request_id: str,
    tokens: list[int],
    table: list[int],
    prompt_len: int | None = None,
    sp: SamplingParams | None = None,
) -> Sequence:
    prompt = tokens[: prompt_len or len(tokens)]
    req = GenerateRequest(request_id, tuple(prompt), sp or SamplingParams())
    s = Sequence.from_request(req, torch.Generator())
    s.token_ids = list(tokens)
    s.block_table = list(table)
    return s


def test_a_mixed_step_packed_by_hand() -> None:
    # A prefill of a whole 6-token prompt (blocks 7, 3), which samples.
    full = seq("full", [10, 11, 12, 13, 14, 15], [7, 3], sp=SamplingParams(prompt_logprobs=1))
    # A decode at position 5 whose last token is still a placeholder for row 1 of the last step.
    dec = seq("dec", [20, 21, 22, 23, 24, -2], [5, 9], prompt_len=4)
    # The second chunk (positions 4..6) of a 9-token prompt: context 7, it does not sample.
    part = seq("part", list(range(30, 39)), [1, 2, 8])
    image = torch.ones(2, 8)
    part.images = (PlacedImage(5, image),)  # positions 5 and 6 are the image's rows 0 and 1
    chunks = [ScheduledChunk(full, 0, 6), ScheduledChunk(dec, 5, 1), ScheduledChunk(part, 4, 3)]

    b = StepBatch.build(chunks, BS)

    assert [c.seq.request_id for c in b.chunks] == ["dec", "full", "part"]  # decodes first
    assert b.token_ids.tolist() == [-2, 10, 11, 12, 13, 14, 15, 34, 35, 36]
    assert b.placeholders
    assert b.positions.tolist() == [5, 0, 1, 2, 3, 4, 5, 4, 5, 6]
    # slot = block * 4 + offset: dec's position 5 is block 9 offset 1; full's 0..5 are 7:0..3,
    # 3:0..1; part's 4..6 are block 2, offsets 0..2.
    assert b.slots.tolist() == [37, 28, 29, 30, 31, 12, 13, 8, 9, 10]
    assert b.num_decodes == 1
    assert b.decode_tables.tolist() == [[5, 9]]
    assert b.decode_ctx_lens.tolist() == [6]
    assert b.prefill_q_starts.tolist() == [1, 7]
    assert b.prefill_q_lens.tolist() == [6, 3]
    assert b.prefill_ctx_lens.tolist() == [6, 7]
    assert b.prefill_tables.tolist() == [[7, 3, 0], [1, 2, 8]]  # padded with block 0
    assert b.sample_rows.tolist() == [0, 6]  # dec's only row, full's last; part is mid-prompt
    assert [s.request_id for s in b.sample_seqs] == ["dec", "full"]
    assert [(c.seq.request_id, row) for c, row in b.prompt_logprobs] == [("full", 1)]
    assert [(r.row, r.first, r.end) for r in b.images] == [(8, 0, 2)]
    assert b.images[0].image.embeds is image
    for a in (b.token_ids, b.positions, b.slots, b.sample_rows):
        assert a.dtype == np.int64
    for a in (b.decode_tables, b.prefill_tables, b.prefill_q_starts, b.prefill_ctx_lens):
        assert a.dtype == np.int32


def test_a_pure_decode_step_has_no_prefill_and_no_placeholder() -> None:
    a = seq("a", [1, 2, 3], [4], prompt_len=2)
    c = seq("c", [1, 2, 3, 4, 5], [6, 2], prompt_len=2)
    b = StepBatch.build([ScheduledChunk(c, 4, 1), ScheduledChunk(a, 2, 1)], BS)
    assert [s.request_id for s in b.sample_seqs] == ["c", "a"]  # the scheduler's order kept
    assert not b.placeholders
    assert b.decode_tables.tolist() == [[6, 2], [4, 0]]
    assert b.decode_ctx_lens.tolist() == [5, 3]
    assert b.prefill_q_lens.tolist() == [] and b.prefill_tables.shape[0] == 0
    assert b.sample_rows.tolist() == [0, 1] and not b.images and not b.prompt_logprobs
