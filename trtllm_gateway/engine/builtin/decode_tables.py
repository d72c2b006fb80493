"""DecodeTables: the decode rows' block tables as one padded array, kept from step to step.

A decode step uploads every running sequence's block table, [rows, widest] int32. Padding them
afresh each step (a concatenation and a masked store over ~37k entries at 256 running) was a
third of packing the batch (issue 39, item 2); from one step to the next the same sequences
decode in the same order and a table changes only in the step that adds a block (one in
block_size steps; a running sequence's table only grows, by appending: scheduler._grow). So the
array is kept, and a step writes only the rows whose table changed: grown (its new blocks), or
another list object (the whole row). Any other change to the rows (a sequence joins, leaves or
moves) builds it again. Callers get a copy: a StepBatch's arrays are never written after build().
"""

from __future__ import annotations

from operator import is_

import numpy as np

from trtllm_gateway.engine.builtin.sequence import Sequence

_SPARE = 8  # columns beyond the widest row: the array grows once in 8 blocks, not once a block
NO_ROWS = np.zeros((0, 1), dtype=np.int32)
_NEW: list[int] = []  # the list a row new to the array was "written from": no table is it


def padded(tables: list[np.ndarray], spare: int = 0) -> np.ndarray:
    """Block tables as [rows, widest + spare] int32, padded with block 0. With no spare, one
    table comes back as a view of itself (never written: a StepBatch's arrays are read only)."""
    if not tables:
        return NO_ROWS if not spare else np.zeros((0, 1 + spare), dtype=np.int32)
    if not spare and len(tables) == 1 and len(tables[0]):
        return tables[0].reshape(1, -1)
    lens = np.fromiter(map(len, tables), np.int64, len(tables))
    out = np.zeros((len(tables), max(int(lens.max()), 1) + spare), dtype=np.int32)
    # One masked store, not a Python store a row.
    out[np.arange(out.shape[1]) < lens[:, None]] = np.concatenate(tables)
    return out


class DecodeTables:
    def __init__(self) -> None:
        self._src: list[Sequence] | None = None  # the list object the rows were last given as
        self._seqs: list[Sequence] = []
        self._lists: list[list[int]] = []  # the block_table list each row was written from
        self._lens: list[int] = []  # ... and its length then
        self._arr = np.zeros((0, 1), dtype=np.int32)  # rows padded with block 0
        self._width = 1

    def of(self, seqs: list[Sequence]) -> np.ndarray:
        """The rows' block tables as [len(seqs), widest] int32, padded with block 0."""
        self._src = seqs
        tables = [s.block_table for s in seqs]
        lens = [len(t) for t in tables]
        if len(seqs) != len(self._seqs) or not all(map(is_, seqs, self._seqs)):
            self._rows_moved(seqs, tables, lens)
        elif lens != self._lens or not all(map(is_, tables, self._lists)):
            self._update(tables, lens)
        return self._arr[: len(seqs), : self._width].copy()

    def extend(self, seqs: list[Sequence], grown: list[int]) -> np.ndarray:
        """of(seqs) for a steady decode step (scheduler.DecodeRows): seqs is the very list
        object of the last call, and only the rows in grown have a block more (appended to
        their lists). Writes only those rows; any other call is of()'s."""
        if seqs is not self._src:
            return self.of(seqs)
        lens = self._lens
        for i in grown:
            table = seqs[i].block_table
            n, was = len(table), lens[i]
            if n > self._arr.shape[1]:
                self._widen(n)
            self._arr[i, was:n] = table[was:n]
            lens[i] = n
            if n > self._width:
                self._width = n
        return self._arr[: len(seqs), : self._width].copy()

    def _widen(self, width: int) -> None:
        grown = np.zeros((self._arr.shape[0], width + _SPARE), dtype=np.int32)
        grown[:, : self._arr.shape[1]] = self._arr
        self._arr = grown

    def _rows_moved(self, seqs: list[Sequence], tables: list[list[int]], lens: list[int]) -> None:
        """Rows joined, left or moved: a row kept takes its old contents to its new place (one
        gather), and only the rows new to the array are written (in a served run's mixed steps
        a few sequences join and leave a step: rebuilding all 256 rows was ~0.3 ms of each)."""
        old = {id(s): i for i, s in enumerate(self._seqs)}
        src = [old.get(id(s), -1) for s in seqs]
        if not seqs or src.count(-1) * 2 > len(seqs):
            self._arr = padded([s.block_table_array() for s in seqs], _SPARE)
            self._seqs, self._lists, self._lens = list(seqs), tables, lens
            self._width = max(max(lens, default=1), 1)
            return
        self._arr = self._arr[np.maximum(np.asarray(src), 0)]
        self._seqs = list(seqs)
        # A new row's old list and length match nothing: _update writes the whole row.
        old_lists, old_lens = self._lists, self._lens
        self._lists = [old_lists[i] if i >= 0 else _NEW for i in src]
        self._lens = [old_lens[i] if i >= 0 else -1 for i in src]
        self._update(tables, lens)

    def _update(self, tables: list[list[int]], lens: list[int]) -> None:
        old_lists, old_lens = self._lists, self._lens
        changed = [
            i
            for i, (t, n) in enumerate(zip(tables, lens, strict=True))
            if n != old_lens[i] or t is not old_lists[i]
        ]
        width = max(max(lens), self._width)
        if width > self._arr.shape[1]:
            self._widen(width)
        arr = self._arr
        for i in changed:
            n, was = lens[i], old_lens[i]
            if tables[i] is old_lists[i] and n > was:
                arr[i, was:n] = tables[i][was:n]  # blocks appended: only they are new
            else:
                arr[i, :n] = tables[i]
                arr[i, n:] = 0  # a replaced, shorter table leaves no stale blocks behind
        self._lists, self._lens = tables, lens
        self._width = max(max(lens, default=1), 1)
