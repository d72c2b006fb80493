"""AdmissionControl over SharedCounts (--api-server-count): two on one counts file stand for
two API server processes; each maps the file and locks it on its own descriptor, as they do."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from trtllm_gateway.app.drain import Drain
from trtllm_gateway.web.admission import AdmissionControl
from trtllm_gateway.web.errors import ServiceUnavailableError
from trtllm_gateway.web.shared_counts import SharedCounts

Pair = tuple[AdmissionControl, AdmissionControl]  # two API servers


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    path = str(tmp_path / "admission")
    SharedCounts.create(path)
    return (
        AdmissionControl(running=2, queued=1, shared=SharedCounts(path)),
        AdmissionControl(running=2, queued=1, shared=SharedCounts(path)),
    )


def test_the_limit_counts_both_servers(pair: Pair) -> None:
    a, b = pair
    held = [a.reserve(), a.reserve(), b.reserve()]  # capacity 3: 2 running + 1 queued
    with pytest.raises(ServiceUnavailableError) as exc:
        b.reserve()  # b holds one itself: only the shared count refuses it
    assert exc.value.code == "queue_full"
    with pytest.raises(ServiceUnavailableError):
        a.reserve()
    assert (a.in_flight, b.in_flight) == (2, 1)  # each its own (its drain waits for these)
    assert a.total_in_flight == b.total_in_flight == 3
    assert a.queued == b.queued == 1
    assert a.rejections() == b.rejections() == {"queue_full": 2, "draining": 0}
    held[0].release()
    held[0].release()  # idempotent: counted back once
    assert b.total_in_flight == 2
    b.reserve().release()
    for slot in held[1:]:
        slot.release()
    assert a.total_in_flight == 0


def test_an_idle_gateway_admits_a_request_past_the_limit(
    pair: Pair,
) -> None:
    a, b = pair
    big = b.reserve(weight=5)  # nothing in flight on any server
    with pytest.raises(ServiceUnavailableError):
        a.reserve()
    big.release()
    a.reserve().release()


def test_draining_refusals_are_counted_once_for_all(
    pair: Pair,
) -> None:
    a, b = pair
    a.close()
    with pytest.raises(ServiceUnavailableError) as exc:
        a.reserve()
    assert exc.value.code == "draining"
    assert b.rejections() == {"queue_full": 0, "draining": 1}
    b.reserve().release()  # closing one server's admission leaves the other's open


async def test_a_drained_server_stays_up_until_every_server_is_idle(pair: Pair) -> None:
    """--api-server-count N shares one listening socket: a server that has drained keeps
    answering 503 while another still drains (exiting, it would close connections the kernel had
    just handed it: a /health reset instead of a 503), and stops waiting at the drain's timeout."""
    a, b = pair
    held = b.reserve()  # a request still streaming on the other server
    drain = Drain(a, timeout_s=30)
    run = asyncio.create_task(drain.run())
    await asyncio.sleep(0.3)
    assert not run.done() and a.closed  # idle itself, admission closed, still up
    held.release()
    await asyncio.wait_for(run, 1)
    b.reserve()  # never released: the timeout ends the wait
    t0 = time.monotonic()
    await asyncio.wait_for(Drain(a, timeout_s=0.5).run(), 3)
    assert 0.4 < time.monotonic() - t0 < 2
