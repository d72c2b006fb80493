"""StepClock: a timed step's stages in wall and thread CPU time, every `every`-th step, and the
loop's time between steps; a stage that sleeps shows wall time without CPU time."""

from __future__ import annotations

import time

from trtllm_gateway.engine.builtin.step_clock import StepClock


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_timed_steps_split_wall_and_cpu_time() -> None:
    clock = StepClock(every=2)
    for i in range(6):
        clock.start()
        _spin(0.002)
        clock.lap("work")
        if i == 3:
            clock.kind = "decode"
        time.sleep(0.004)
        clock.lap("wait")
        clock.end()
        time.sleep(0.003)  # the loop between steps: a message wait
    assert clock.steps == 6 and clock.timed == 3
    assert clock.wall.keys() == {"work", "wait", "between"}
    n = clock.timed
    assert clock.wall["work"] / n >= 0.002 and clock.cpu["work"] / n >= 0.0015
    assert clock.wall["wait"] / n >= 0.004 and clock.cpu["wait"] / n < 0.002
    # between: from the end of each untimed step to the start of the timed one after it
    assert clock.wall["between"] / n >= 0.003 and clock.cpu["between"] / n < 0.002
    text = clock.summary()
    assert text.startswith("6 steps (3 timed)") and "work " in text and "between " in text
    # by kind: steps 2 and 6 (1-based) are mixed, step 4 decode; only timed steps count
    assert {k: v[0] for k, v in clock.kinds.items()} == {"mixed": 2, "decode": 1}
    assert clock.kinds["decode"][1].keys() == {"work", "wait", "between"}
    assert clock.kinds["decode"][1]["wait"] >= 0.004
    assert "decode steps (1 timed): " in text and "mixed steps (2 timed): " in text


def test_untimed_steps_record_nothing() -> None:
    clock = StepClock(every=8)
    for _ in range(7):
        clock.start()
        clock.lap("work")
        clock.end()
    assert clock.timed == 0 and clock.wall == {} and clock.cpu == {} and clock.kinds == {}


def test_every_step_counts_its_size_by_kind() -> None:
    """size() counts every step, timed or not: steps, sequences and tokens by kind."""
    clock = StepClock(every=8)
    for seqs, tokens, kind in ((256, 256, "decode"), (250, 1274, "mixed"), (200, 200, "decode")):
        clock.start()
        clock.size(kind, seqs, tokens)
        clock.end()
    assert clock.timed == 0
    assert clock.sizes == {"decode": [2, 456, 456], "mixed": [1, 250, 1274]}
    text = clock.summary()
    assert "decode 2 steps, 228.0 sequences and 228.0 tokens a step" in text
    assert "mixed 1 steps, 250.0 sequences and 1274.0 tokens a step" in text
