"""bench/disagg_mix.py's figures: goodput counts the requests that met both SLOs (their TTFT,
and the p99 of their own gaps between tokens) per second of wall time; per-class figures."""

from __future__ import annotations

from typing import Any

from bench.disagg import handoff_cost, path_counters
from bench.disagg_mix import figures, meets_slo


def rec(start: float, ttft: float, gaps: list[float], ok: bool = True) -> dict[str, Any]:
    end = start + ttft + sum(gaps)
    return {
        "ok": ok,
        "start": start,
        "end": end,
        "ttft": ttft,
        "itl": gaps,
        "output_tokens": 1 + len(gaps),
    }


def test_goodput_counts_requests_meeting_both_slos_per_second_of_wall() -> None:
    long = [
        rec(0.0, 1.0, [0.01] * 9),  # meets both
        rec(0.0, 3.0, [0.01] * 9),  # TTFT over 2 s
    ]
    short = [
        rec(0.0, 0.5, [0.01] * 8 + [0.2]),  # one 200 ms stall: its own ITL p99 is over 50 ms
        rec(1.0, 0.5, [0.01] * 9),  # meets both
        rec(0.0, 0.1, [], ok=False),  # failed: never good
    ]
    report = figures({"long": long, "short": short})
    wall = 3.09  # first start 0.0, last end 3.0 + 0.09
    assert abs(report["wall_s"] - wall) < 1e-9
    assert report["met_slo"] == 2 and report["requests"] == 5
    assert abs(report["goodput_req_s"] - 2 / wall) < 1e-9
    assert report["classes"]["long"]["met_slo"] == 1
    assert report["classes"]["short"]["failed"] == 1
    assert abs(report["classes"]["long"]["output_tok_s"] - 20 / wall) < 1e-9
    assert not meets_slo(rec(0.0, 2.0001, []), 2.0, 0.05)
    assert meets_slo(rec(0.0, 2.0, [0.05]), 2.0, 0.05)


def test_path_counters_are_deltas_over_the_mix() -> None:
    p = "trtllm_gateway:remote_prefill_total"
    before = {f'{p}{{model_name="m",outcome="remote"}}': 3.0}
    after = {
        f'{p}{{model_name="m",outcome="remote"}}': 10.0,
        f'{p}{{model_name="m",outcome="local_busy"}}': 2.0,
        'trtllm_gateway:remote_prefill_busy_total{model_name="m",sibling="http://a"}': 5.0,
        'trtllm_gateway:sibling_healthy{sibling="http://a"}': 1.0,
    }
    got = path_counters(before, after)
    assert got["paths"]["remote"] == 7.0 and got["paths"]["local_busy"] == 2.0
    assert got["busy_answers"] == 5.0 and got["siblings_unhealthy_at_end"] == 0


def test_handoff_cost_is_step_seconds_over_handoffs_during_the_mix() -> None:
    p = 'trtllm_gateway:kv_handoff{}_total{{model_name="m"}}'
    before = {p.format("s"): 2.0, p.format("_step_seconds"): 0.001}
    after = {p.format("s"): 12.0, p.format("_step_seconds"): 0.0015}
    got = handoff_cost(before, after)
    assert got["handoffs"] == 10.0 and abs(got["step_us_per_handoff"] - 50.0) < 1e-6
    assert handoff_cost(after, after)["step_us_per_handoff"] == 0.0  # none: no division
