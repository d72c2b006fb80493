"""Continuous-batching scheduler: FCFS admission, chunked prefill under a token budget, preemption.

Every step packs the running sequences first (one token per decode, the next chunk of an
unfinished prefill), then admits waiting sequences while the token budget, the batch-size cap and
the free KV blocks allow. When a running sequence needs a block and none is free, the most
recently admitted sequence is preempted: its blocks are freed and it waits to be recomputed.
A waiting sequence holds no blocks: it looks up its cached prefix each time it is tried.

The steady step: when every running sequence decodes one token, and the running list is the last
run's rows (less those that ended, plus those admitted at its end since), schedule_decodes() gives
this step's rows as arrays (DecodeRows) without reading them row by row, and the pipeline packs
and commits them from there. A served core at 256 running spent ~16 passes of Python over its
rows a step (the chunks, the packer's lists, the commit): schedule, build and commit were ~0.8
ms of a decode step's ~2 ms of CPU (py-spy and StepClock, H200, 135M, 2026-11-29), 0.21-0.26 ms
less with the steady step (docs/benchmarks.md, "The steady step").

A row whose pending token is its last by max_tokens (drains()) is not scheduled again: at
overlap depth 1 the step after it is scheduled before its token is known, and would compute a
token nobody reads (vLLM's scheduler skips the same rows under async scheduling:
vllm/v1/core/sched/scheduler.py, Scheduler.schedule, "Avoid scheduling an extra step"). The
sequence ends when that token is resolved. A one-token context phase (a disaggregated prefill
instance's) thus costs no decode step after its prefill, nor a block for the token after its
prompt.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from operator import is_

import numpy as np

from trtllm_gateway.engine.builtin.block_manager import BlockManager, block_hashes
from trtllm_gateway.engine.builtin.sequence import Sequence, Status
from trtllm_gateway.engine.kv_events.log import MmSpan


@dataclass(slots=True)
class ScheduledChunk:
    seq: Sequence
    start: int  # first token position computed this step
    length: int  # tokens computed this step

    @property
    def samples(self) -> bool:
        """True when the chunk reaches the end of the sequence, so a token is sampled."""
        return self.start + self.length == self.seq.num_tokens


@dataclass(slots=True)
class DecodeRows:
    """A steady step's rows: every running sequence, in order, decoding the one token after its
    last (each row samples). What never changes along a run (the list, the per-row flags) is
    shared by its steps; starts and grown are the step's own."""

    seqs: list[Sequence]  # the run's snapshot of Scheduler.running, never written
    starts: np.ndarray  # [n] int64: the position each row computes this step
    grown: list[int]  # rows given a block this step (their new token opens it)
    nonplain: list[int]  # rows that are not plain (Sequence.settle): per-row checks need them
    draws_raw: bool  # every row draws straight from the logits (sampler.Draws)
    drawn: list[int]  # rows that are not greedy
    ends: np.ndarray  # [n] int64: each row's prompt + max_tokens (its token at end - 1 is its last)

    @classmethod
    def of(cls, running: list[Sequence], starts: list[int] | np.ndarray) -> DecodeRows:
        seqs = list(running)
        return cls(
            seqs,
            np.asarray(starts, dtype=np.int64),
            [],
            [i for i, s in enumerate(seqs) if not s.plain],
            all(s.draws_raw for s in seqs),
            [i for i, s in enumerate(seqs) if not s.greedy],
            np.asarray([s.prompt_len + s.sampling.max_tokens for s in seqs], dtype=np.int64),
        )

    def without_last_tokens(self) -> DecodeRows | None:
        """These rows less those whose pending token is their last (drains()); self when none
        is, None when all are."""
        live = self.starts + 1 < self.ends
        if live.all():
            return self
        keep = np.flatnonzero(live)
        if not len(keep):
            return None
        return DecodeRows.of([self.seqs[i] for i in keep.tolist()], self.starts[keep])

    def chunks(self) -> list[ScheduledChunk]:
        """The rows as the general path's chunks (for a step that failed)."""
        n = len(self.seqs)
        return list(map(ScheduledChunk, self.seqs, self.starts.tolist(), [1] * n))


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_batch_size: int,
        max_num_tokens: int,
        on_import: Callable[[Sequence], None] | None = None,
    ) -> None:
        self.blocks = blocks
        self.on_import = on_import  # writes a decode-side sequence's imported prompt KV
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found cached
        self.last_scheduled = 0  # chunks the last schedule() packed (0 with work: stalled)
        # The last step's rows when it decoded every running sequence (schedule_decodes).
        self._steady: DecodeRows | None = None
        self.steady_steps = True  # False: every step takes schedule() (tests compare the two)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule_decodes(self) -> DecodeRows | None:
        """This step's rows when it is steady: every running sequence decodes one token, and
        the running list is the last run's (a step that decoded each of its rows and committed
        them), less the rows that left since, plus those admitted since at its end (each past
        its prompt now); no waiting prompt could be admitted beside them. A row whose new token
        opens a block gets one here. None: schedule() packs the step (and starts a run)."""
        run, self._steady = self._steady, None
        running = self.running
        n = len(running)
        if run is None or not n or n > self.max_num_tokens:
            return None
        if self.waiting and n < self.max_batch_size and n < self.max_num_tokens:
            return None  # a prompt that may be admitted: the general path tries
        rows = _continued(run, running)
        if rows is None:
            return None
        rows = rows.without_last_tokens()
        if rows is None:
            return None  # every row's pending token is its last: the general path resolves
        n = len(rows.seqs)
        starts, seqs = rows.starts, rows.seqs
        bs = self.blocks.block_size
        opens = np.flatnonzero(starts % bs == 0).tolist()
        grown = [i for i in opens if len(seqs[i].block_table) * bs <= int(starts[i])]
        if grown:
            if not self.blocks.can_allocate(len(grown)):
                return None  # the general path preempts
            for i, block in zip(grown, self.blocks.allocate(len(grown)), strict=True):
                seqs[i].block_table.append(block)
        rows.grown = grown
        self._steady = rows if self.steady_steps else None
        self.last_scheduled = n
        return rows

    def commit_decodes(self, rows: DecodeRows) -> None:
        """After a steady step's forward pass: commit() for its rows still running (those the
        step resolved meanwhile did not finish), publishing the blocks their token filled."""
        finished = Status.FINISHED
        ends = rows.starts + 1
        seqs = rows.seqs
        for seq, end in zip(seqs, ends.tolist(), strict=True):
            if seq.status is not finished:
                seq.num_computed = end
        if self.blocks.caching:
            bs = self.blocks.block_size
            for i in np.flatnonzero(ends % bs == 0).tolist():
                if seqs[i].status is not finished:
                    self._publish(seqs[i], int(ends[i]) - 1)

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_tokens
        self._steady = None
        packed = self._schedule_all_running(budget)
        chunks, budget = packed if packed is not None else self._schedule_running(budget)
        self._admit_waiting(chunks, budget)
        self.last_scheduled = len(chunks)
        return chunks

    def _schedule_all_running(self, budget: int) -> tuple[list[ScheduledChunk], int] | None:
        """Every running sequence's whole next chunk at once, when they all fit the budget and
        the free blocks (no preemption): what _schedule_running would pack then, in whole-batch
        comprehensions rather than a loop body a row (issue 39, item 2). None: take the loop."""
        running = [s for s in self.running if not drains(s)]
        done = [s.num_computed for s in running]
        need = [len(s.token_ids) - d for s, d in zip(running, done, strict=True)]
        total = sum(need)
        if total > budget or 0 in need:
            return None
        bs = self.blocks.block_size
        # Each chunk ends at its sequence's end (done + need == len(token_ids)).
        short = [i for i, s in enumerate(running) if len(s.token_ids) > len(s.block_table) * bs]
        if short:
            blocks = self.blocks
            grow = [
                blocks.blocks_needed(done[i] + need[i]) - len(running[i].block_table) for i in short
            ]
            if not blocks.can_allocate(sum(grow)):
                return None
            for i, n in zip(short, grow, strict=True):
                running[i].block_table += blocks.allocate(n)
        if total == len(running) and total and self.steady_steps:  # every row decodes: a run
            self._steady = DecodeRows.of(running, done)
        return list(map(ScheduledChunk, running, done, need)), budget - total

    def _schedule_running(self, budget: int) -> tuple[list[ScheduledChunk], int]:
        """The running sequences in order under the budget, preempting for blocks."""
        chunks: list[ScheduledChunk] = []
        bs = self.blocks.block_size
        running = Status.RUNNING
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not running or drains(seq):
                continue  # preempted earlier in this loop, or its pending token is its last
            done = seq.num_computed
            n = min(len(seq.token_ids) - done, budget)
            # _grow only when the chunk runs past the blocks it has (a decode: once a block).
            if done + n > len(seq.block_table) * bs and not self._grow(seq, done + n):
                continue  # seq itself was preempted
            chunks.append(ScheduledChunk(seq, done, n))
            budget -= n
        return chunks, budget

    def _admit_waiting(self, chunks: list[ScheduledChunk], budget: int) -> None:
        """Admit waiting sequences FCFS while the budget, the batch cap and the blocks allow."""
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            if seq.kv_import is not None or seq.kv_loaded:
                if not self._admit_imported(seq):
                    break
                chunks.append(ScheduledChunk(seq, seq.num_computed, 1))
                budget -= 1
                continue
            self._match_prefix(seq)
            n = min(seq.num_tokens - seq.num_computed, budget)
            need = self.blocks.blocks_needed(seq.num_computed + n) - len(seq.block_table)
            if not self.blocks.can_allocate(need):
                # Head-of-line waits (add() refused requests that can never fit), holding no
                # blocks: a waiting sequence that kept its matched prefix could never be
                # preempted, and two of them could hold each other's blocks for ever.
                self.release(seq)
                seq.num_computed = 0
                break
            seq.block_table += self.blocks.allocate(need)
            self._count_prefix(seq)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            seq.settle()
            if seq.first_scheduled is None:
                seq.first_scheduled = time.perf_counter()
            self.running.append(seq)
            chunks.append(ScheduledChunk(seq, seq.num_computed, n))
            budget -= n

    def _admit_imported(self, seq: Sequence) -> bool:
        """A decode-side sequence goes on from its last token: its blocks were reserved and written
        by the core's transfer worker (kv_loaded), or get the sibling's KV here."""
        if not seq.kv_loaded:
            need = self.blocks.blocks_needed(seq.num_tokens)
            if not self.blocks.can_allocate(need):
                return False
            seq.block_table = self.blocks.allocate(need)
            assert self.on_import is not None
            self.on_import(seq)
            seq.kv_import = None
        seq.num_computed = seq.prompt_len
        self.waiting.popleft()
        seq.status = Status.RUNNING
        seq.settle()
        seq.first_scheduled = seq.first_scheduled or time.perf_counter()
        self.running.append(seq)
        self._publish(seq, 0)
        return True

    def _match_prefix(self, seq: Sequence) -> None:
        """Reuse cached full blocks of the prompt; always leave at least one token to compute."""
        bs = self.blocks.block_size
        self._extend_hashes(seq, seq.num_tokens - 1)
        # Prompt logprobs need every prompt position computed, so such requests skip the cache.
        wants_all = seq.sampling.prompt_logprobs is not None and not seq.prompt_logprobs_done
        found = [] if wants_all else self.blocks.match_prefix(seq.block_hashes)
        self.blocks.acquire(found)
        seq.block_table = list(found)
        seq.num_computed = len(found) * bs

    def _count_prefix(self, seq: Sequence) -> None:
        """Prefix-cache counters, once a request, when it is first admitted."""
        if seq.preemptions == 0:
            self.prefix_queries += seq.prompt_len
            self.prefix_hits += seq.num_computed
            seq.num_cached = seq.num_computed

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        bs = self.blocks.block_size
        hashes = block_hashes(b"", token_ids[: (len(token_ids) - 1) // bs * bs], bs)
        return len(self.blocks.match_prefix(hashes)) * bs

    def _extend_hashes(self, seq: Sequence, upto_tokens: int) -> None:
        bs = self.blocks.block_size
        hashes = seq.block_hashes
        start, end = len(hashes) * bs, upto_tokens // bs * bs
        if end > start:
            prev = hashes[-1] if hashes else b""
            hashes += block_hashes(prev, seq.token_ids[start:end], bs, seq.extra_key)

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        need = self.blocks.blocks_needed(num_tokens) - len(seq.block_table)
        while not self.blocks.can_allocate(need):
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        if need > 0:
            seq.block_table += self.blocks.allocate(need)
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def commit(self, chunks: list[ScheduledChunk]) -> None:
        """After the forward pass: advance progress and publish newly full blocks (a chunk that
        fills none has nothing to publish: its hashes wait for the step that fills its block)."""
        bs = self.blocks.block_size
        caching = self.blocks.caching
        for c in chunks:
            end = c.seq.num_computed = c.start + c.length
            if caching and c.start // bs != end // bs:
                self._publish(c.seq, c.start)

    def _publish(self, seq: Sequence, start: int) -> None:
        """Register the blocks filled since token `start` in the prefix cache."""
        if not self.blocks.caching:
            return
        bs = self.blocks.block_size
        self._extend_hashes(seq, seq.num_computed)
        lo, hi = start // bs, seq.num_computed // bs
        if hi <= lo:
            return
        hashes, spans = seq.block_hashes, seq.mm_spans
        if hi == lo + 1 and not spans:  # a decode's block: most calls
            parent = hashes[lo - 1] if lo else None
            tokens = seq.token_ids[lo * bs : hi * bs]
            self.blocks.register(seq.block_table[lo], hashes[lo], parent, tokens)
            return
        # Every block's hash mixes in all the request's images (seq.extra_key), so every
        # block's event names them all, each at its offset from the block's first token.
        mm = (
            [tuple(MmSpan(h, pos - i * bs, n) for h, pos, n in spans) for i in range(lo, hi)]
            if spans
            else ()  # a text prompt's blocks: no list of 64 empty tuples to build and scan
        )
        self.blocks.register_run(
            seq.block_table[lo:hi],
            hashes[lo:hi],
            hashes[lo - 1] if lo else None,
            seq.token_ids[lo * bs : hi * bs],
            mm,
        )

    def finish(self, seq: Sequence, keep_blocks: bool = False) -> None:
        """Take a sequence out of the queues and release its blocks unless asked to keep them."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED
        if not keep_blocks:
            self.release(seq)

    def release(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_table)
        seq.block_table = []


def _continued(run: DecodeRows, running: list[Sequence]) -> DecodeRows | None:
    """The run's rows a token on, if running is them (those that left dropped) and then the
    sequences admitted since, each with one token to compute; else None."""
    seqs = run.seqs
    if len(running) == len(seqs) and all(map(is_, running, seqs)):  # most steps
        return DecodeRows(
            seqs, run.starts + 1, [], run.nonplain, run.draws_raw, run.drawn, run.ends
        )
    on = Status.RUNNING
    kept = [i for i, s in enumerate(seqs) if s.status is on]
    k = len(kept)
    if k > len(running) or not all(map(is_, running[:k], [seqs[i] for i in kept])):
        return None
    tail = running[k:]
    if any(len(s.token_ids) - s.num_computed != 1 for s in tail):
        return None  # a prompt still being prefilled (or recomputed)
    starts = run.starts[kept] + 1
    if tail:
        starts = np.concatenate([starts, np.asarray([s.num_computed for s in tail], np.int64)])
    return DecodeRows.of(running, starts)


def drains(seq: Sequence) -> bool:
    """seq decodes, and its pending token (a placeholder, not yet on the host) is its last by
    max_tokens: the sequence ends when it is resolved, so no step computes a token after it."""
    ids = seq.token_ids
    n = len(ids)  # the length test first: it is False for every row but the ending ones
    if n < seq.prompt_len + seq.sampling.max_tokens:
        return False
    return ids[-1] < 0 and n - seq.num_computed == 1
