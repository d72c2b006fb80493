"""routers/openai/stop_strings.py: the Aho-Corasick stop automaton gives exactly what the
find/endswith
loop it replaced gave (kept here as the oracle), chunk by chunk, on random texts and stops, and
its cost per character does not grow with the number of stop strings (issue 40, item 4)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from trtllm_gateway.engine.protocol import TokenEvent
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.routers.openai.choice_output import ChoiceOutput
from trtllm_gateway.routers.openai.stop_strings import ROOT, StopStrings


class LoopStops:
    """The stop check before the automaton (choice_output.py at 5153443): the oracle."""

    def __init__(self, stops: Sequence[str], include: bool) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include = include
        self.text = ""
        self.emitted = 0
        self.stop_reason: str | None = None

    def feed(self, new: str, last: bool) -> str:
        self.text += new
        end = self._apply()
        if end is None:
            end = len(self.text) if last else len(self.text) - self._held()
        out = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out

    def _apply(self) -> int | None:
        best: tuple[int, str] | None = None
        for stop in self.stops:
            idx = self.text.find(stop, self.emitted)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        idx, stop = best
        self.text = self.text[: idx + len(stop)]
        self.stop_reason = stop
        return idx + len(stop) if self.include else idx

    def _held(self) -> int:
        pending = len(self.text) - self.emitted
        held = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, pending), held, -1):
                if self.text.endswith(stop[:k]):
                    held = k
                    break
        return held


class ChunkTokenizer:
    """Token id i decodes to chunks[i]: a detokenizer without tokens' quirks."""

    def __init__(self, chunks: Sequence[str]) -> None:
        self.chunks = chunks

    def detokenizer(self, prompt_token_ids: Any, skip_special: bool) -> Any:
        chunks = self.chunks

        class Detok:
            def add(self, ids: Sequence[int]) -> str:
                return "".join(chunks[i] for i in ids)

            def flush(self) -> str:
                return ""

        return Detok()


def _feed_both(
    chunks: list[str], stops: list[str], include: bool
) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    tok = cast(Tokenizer, ChunkTokenizer(chunks))
    new = ChoiceOutput(tok, stop=stops, include_stop_str_in_output=include)
    old = LoopStops(stops, include)
    got, want = [], []
    for i in range(len(chunks)):
        last = i == len(chunks) - 1
        delta = new.feed(TokenEvent(token_ids=(i,), finish_reason="length" if last else None))
        got.append((delta.text, delta.stop_reason))
        want.append((old.feed(chunks[i], last), old.stop_reason))
        if new.finished or old.stop_reason is not None:
            break
    return got, want


ALPHABET = "abc"


@settings(max_examples=600, deadline=None)
@given(
    chunks=st.lists(st.text(ALPHABET, max_size=5), min_size=1, max_size=12),
    stops=st.lists(st.text(ALPHABET, max_size=4), max_size=6),
    include=st.booleans(),
)
def test_the_automaton_matches_the_loop_it_replaced(
    chunks: list[str], stops: list[str], include: bool
) -> None:
    got, want = _feed_both(chunks, stops, include)
    assert got == want


def test_ties_and_overlaps() -> None:
    """Earliest start wins, then the first in the list; a stop inside a longer one; repeats."""
    cases = [
        (["abc"], ["abc", "ab"]),
        (["abc"], ["ab", "abc"]),
        (["ab", "c"], ["abc", "ab"]),
        (["xabcd"], ["bc", "abcd"]),
        (["aab"], ["ab", "aab", "ab"]),
        (["he said STO", "P now"], ["STOP", "P n"]),
    ]
    for chunks, stops in cases:
        for include in (False, True):
            got, want = _feed_both(chunks, stops, include)
            assert got == want, (chunks, stops, include)


def test_the_cost_per_character_does_not_grow_with_the_stops() -> None:
    """12,000 four-character stops (the issue's request) cost about what 4 do per character;
    the loop cost 12,000 finds and endswiths per token."""
    import itertools

    many = ["".join(p) for p in itertools.islice(itertools.product("wxyz!?", repeat=5), 12000)]
    text = "The quick brown fox jumps over the lazy dog. " * 200

    def per_char(stops: StopStrings) -> float:
        state, t0 = ROOT, time.perf_counter()
        for end in range(0, len(text), 4):
            state, match = stops.scan(text[: end + 4], end, state)
            assert match is None
        return (time.perf_counter() - t0) / len(text)

    few = per_char(StopStrings(["wxyz!", "zzzzz", "?????", "!!!!!"]))
    lots = per_char(StopStrings(many))
    assert lots < 5 * few + 2e-6, (few, lots)
