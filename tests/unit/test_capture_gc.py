"""capture_gc.no_collection (trtllm_gateway/engine/builtin/capture_gc.py): cyclic garbage is
collected before a capture and the collector stays off inside, whatever triggers it; on exit it
is back as it was. On a GPU, tests/gpu/test_graph_sampling.py builds engine after engine in one
process: its captures failed with the collector on (capture_gc.py's docstring)."""

from __future__ import annotations

import gc

from trtllm_gateway.engine.builtin.capture_gc import no_collection

FINALIZED: list[str] = []


class _Dead:
    def __init__(self, name: str) -> None:
        self.name = name
        self.me = self  # a cycle: only the collector frees it

    def __del__(self) -> None:
        FINALIZED.append(self.name)


def test_garbage_goes_before_and_none_is_collected_inside() -> None:
    old = gc.get_threshold()
    FINALIZED.clear()
    try:
        gc.set_threshold(1)  # a collection at nearly every allocation
        _Dead("before")
        with no_collection():
            assert FINALIZED == ["before"]
            assert not gc.isenabled()
            for i in range(200):
                _Dead(f"inside {i}")
            junk = [[object()] for _ in range(1000)]
            assert FINALIZED == ["before"], "collected mid-capture"
            del junk
        assert gc.isenabled()
        gc.collect()
        assert len(FINALIZED) == 201
    finally:
        gc.set_threshold(*old)


def test_the_collector_stays_off_when_it_was_off_and_comes_back_after_an_error() -> None:
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    try:
        with no_collection():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()
