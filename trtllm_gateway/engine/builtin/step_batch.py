"""StepBatch: one step's scheduled chunks packed once, on the host, for whichever backend runs it.

One packer for every device: CpuBackend (SDPA, cpu_kernels/) and TritonBackend (kernels/, CUDA
graphs) take the same batch and differ only in the forward they run on it.

  chunks ─▶ decodes first ─▶ token_ids, positions, slots           one row per new token
                          ├▶ decode_tables                         one row per decode
                          ├▶ prefill q_starts, q_lens, ctx_lens, tables   one per prefill chunk
                          ├▶ sample_rows, sample_seqs              the chunks that reach their end
                          ├▶ prompt_logprobs                       (chunk, first row) that want them
                          └▶ images                                rows an image's embeddings fill

A steady step (scheduler.DecodeRows: every running sequence decodes, as in the step before) is
packed by of_decodes() from the rows' arrays, with no ScheduledChunk a row: `chunks` makes them
only when asked.

Decodes (one new token) lead, so they batch into one decode-attention call. A token id may be a
placeholder -(r + 1) for row r of the previous step's sampled ids, not yet on the host
(pipeline.py, depth 1); the backend swaps it on its device. All arrays are numpy, never written
after build().
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtllm_gateway.engine.builtin.decode_tables import NO_ROWS, DecodeTables, padded
from trtllm_gateway.engine.builtin.scheduler import DecodeRows, ScheduledChunk
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.builtin.vision.placeholders import ImageRows, image_rows


def _extras(
    c: ScheduledChunk,
    row: int,
    prompt_lps: list[tuple[ScheduledChunk, int]],
    images: list[ImageRows],
) -> None:
    """The chunk's prompt logprobs (still wanted) and the image rows it covers, if any."""
    seq = c.seq
    if seq.sampling.prompt_logprobs is not None and not seq.prompt_logprobs_done:
        prompt_lps.append((c, row))
    if seq.images:
        images += image_rows(seq.images, c.start, c.length, row)


_NO_INT32 = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class StepBatch:
    packed_chunks: tuple[ScheduledChunk, ...]  # in packed order: decodes first (see chunks)
    token_ids: np.ndarray  # [T] int64; a placeholder -(r + 1) is row r of the previous samples
    positions: np.ndarray  # [T] int64
    slots: np.ndarray  # [T] int64 cache slot of each new token (block * block_size + offset)
    num_decodes: int  # rows [0, num_decodes) are single-token decodes
    decode_tables: np.ndarray  # [num_decodes, w] int32
    prefill_q_starts: np.ndarray  # [P] int32 first packed row of each prefill chunk
    prefill_q_lens: np.ndarray  # [P] int32
    prefill_ctx_lens: np.ndarray  # [P] int32 context after this step, the chunk included
    prefill_tables: np.ndarray  # [P, w] int32
    sample_rows: np.ndarray  # [S] int64 the last row of each chunk that samples
    sample_seqs: tuple[Sequence, ...]  # their sequences, in row order
    prompt_logprobs: tuple[tuple[ScheduledChunk, int], ...]  # (chunk, its first row)
    images: tuple[ImageRows, ...]
    placeholders: bool  # some token id is a placeholder
    decode_rows: DecodeRows | None = None  # a steady step's rows (of_decodes): no packed_chunks

    @property
    def chunks(self) -> tuple[ScheduledChunk, ...]:
        """The step's chunks in packed order (a steady step's made now, one a row)."""
        rows = self.decode_rows
        return self.packed_chunks if rows is None else tuple(rows.chunks())

    @property
    def num_chunks(self) -> int:
        rows = self.decode_rows
        return len(self.packed_chunks) if rows is None else len(rows.seqs)

    @property
    def decode_ctx_lens(self) -> np.ndarray:
        """[num_decodes] context length of each decode row, its new token included."""
        return self.positions[: self.num_decodes] + 1

    @classmethod
    def build(
        cls, chunks: list[ScheduledChunk], block_size: int, tables: DecodeTables | None = None
    ) -> StepBatch:
        """tables: the decode rows' tables kept from the step before (the pipeline's)."""
        bs = block_size
        decodes = [c for c in chunks if c.length == 1]
        prefills = [c for c in chunks if c.length != 1] if len(decodes) < len(chunks) else []
        # Decodes: a few whole-batch comprehensions and numpy ops, no Python loop body a row
        # (issue 39, item 2: at 256 running the per-row Python is the serving core's limit).
        d_seqs = [c.seq for c in decodes]
        d_pos = [c.start for c in decodes]
        ids = [s.token_ids[p] for s, p in zip(d_seqs, d_pos, strict=True)]
        if tables is not None:
            d_tables = tables.of(d_seqs) if d_seqs else NO_ROWS
        else:
            d_tables = padded([s.block_table_array() for s in d_seqs])
        nd = len(decodes)
        positions = np.asarray(d_pos, dtype=np.int64)
        if nd:
            blocks = d_tables[np.arange(nd), positions // bs].astype(np.int64)
            d_slots = blocks * bs + positions % bs
        else:
            d_slots = positions
        # A decode chunk samples unless it is a prompt's last token but one (its chunk ends
        # short of the sequence): the common case is every row.
        ends = [len(s.token_ids) - p for s, p in zip(d_seqs, d_pos, strict=True)]
        if ends.count(1) == nd:
            rows: list[int] = list(range(nd))
            sample_seqs = d_seqs
        else:
            rows = [r for r, e in enumerate(ends) if e == 1]
            sample_seqs = [d_seqs[r] for r in rows]
        prompt_lps: list[tuple[ScheduledChunk, int]] = []
        images: list[ImageRows] = []
        if any(not seq.plain for seq in d_seqs):  # most steps: none (one pass, no enumerate)
            for row, c in enumerate(decodes):
                if not c.seq.plain:
                    _extras(c, row, prompt_lps, images)
        # Prompt chunks as numpy parts, joined once: lists of their positions and slots made
        # into arrays cost ~1.4 of a mixed step's ~1.9 ms (8 prompts of 1,024 tokens, 2-core VM).
        pos: list[np.ndarray] = [positions]
        slots: list[np.ndarray] = [d_slots]
        p_tables: list[np.ndarray] = []
        p_start: list[int] = []
        p_len: list[int] = []
        p_ctx: list[int] = []
        row = nd
        for c in prefills:
            seq, start = c.seq, c.start
            end = start + c.length
            toks = seq.token_ids
            table = seq.block_table_array()
            ids += toks[start:end]
            span = np.arange(start, end)
            pos.append(span)
            slots.append(table[span // bs].astype(np.int64) * bs + span % bs)
            p_tables.append(table)
            p_start.append(row)
            p_len.append(c.length)
            p_ctx.append(end)
            if end == len(toks):
                rows.append(end - 1 - start + row)
                sample_seqs.append(seq)
            _extras(c, row, prompt_lps, images)
            row += c.length
        if prefills:
            positions = np.concatenate(pos)
            d_slots = np.concatenate(slots)
        token_ids = np.asarray(ids, dtype=np.int64)
        return cls(
            packed_chunks=tuple(decodes + prefills),
            token_ids=token_ids,
            positions=positions,
            slots=d_slots,
            num_decodes=nd,
            decode_tables=d_tables,
            prefill_q_starts=np.asarray(p_start, dtype=np.int32),
            prefill_q_lens=np.asarray(p_len, dtype=np.int32),
            prefill_ctx_lens=np.asarray(p_ctx, dtype=np.int32),
            prefill_tables=padded(p_tables),
            sample_rows=np.asarray(rows, dtype=np.int64),
            sample_seqs=tuple(sample_seqs),
            prompt_logprobs=tuple(prompt_lps),
            images=tuple(images),
            placeholders=bool(len(token_ids)) and int(token_ids.min()) < 0,
        )

    @classmethod
    def of_decodes(cls, rows: DecodeRows, block_size: int, tables: DecodeTables) -> StepBatch:
        """A steady step: what build() packs for these rows' chunks, from the rows' arrays and
        the tables kept from the step before (only the grown rows written)."""
        bs = block_size
        seqs = rows.seqs
        n = len(seqs)
        positions = rows.starts
        token_ids = np.asarray([s.token_ids[-1] for s in seqs], dtype=np.int64)
        d_tables = tables.extend(seqs, rows.grown)
        slots = d_tables[np.arange(n), positions // bs].astype(np.int64) * bs + positions % bs
        prompt_lps: list[tuple[ScheduledChunk, int]] = []
        images: list[ImageRows] = []
        for row in rows.nonplain:
            _extras(ScheduledChunk(seqs[row], int(positions[row]), 1), row, prompt_lps, images)
        return cls(
            packed_chunks=(),
            token_ids=token_ids,
            positions=positions,
            slots=slots,
            num_decodes=n,
            decode_tables=d_tables,
            prefill_q_starts=_NO_INT32,
            prefill_q_lens=_NO_INT32,
            prefill_ctx_lens=_NO_INT32,
            prefill_tables=NO_ROWS,
            sample_rows=np.arange(n, dtype=np.int64),
            sample_seqs=tuple(seqs),
            prompt_logprobs=tuple(prompt_lps),
            images=tuple(images),
            placeholders=bool(n) and int(token_ids.min()) < 0,
            decode_rows=rows,
        )
