"""A core process started before the gateway builds its app (engine/transport/process.py
prestart): `serve` starts it once the flags are read, the engine's launch takes that very process,
one no launch takes exits on EOF, and a module it cannot import only costs the head start."""

from __future__ import annotations

import psutil
import pytest

from tests.configs import resolve_args
from trtllm_gateway.engine.factory import create_engine, prestarted_core
from trtllm_gateway.engine.transport import process
from trtllm_gateway.engine.transport.client import CoreClient

CORE = "trtllm_gateway.engine.builtin.core"


@pytest.fixture(autouse=True)
def _no_warm_left() -> object:
    yield
    process.discard_warm()


def _warm_pid() -> int:
    assert len(process._warm) == 1
    return process._warm[0].pid


def test_only_a_core_that_runs_in_a_process_is_prestarted() -> None:
    for argv in (("--no-engine-process",), ("--mode", "encode")):
        with prestarted_core(resolve_args(*argv)):
            assert not process._warm
    with prestarted_core(resolve_args("--engine-process")):
        proc = process._warm[0]
        assert psutil.Process(proc.pid).cmdline()[-2:] == ["--import", CORE]
        process.prestart((CORE,))  # one at a time
        assert _warm_pid() == proc.pid
    # the block launched nothing: the process it started is gone with it
    assert not process._warm and proc.returncode is not None


@pytest.mark.parametrize("modules", [(CORE,), ("no_such_module_anywhere",)])
async def test_the_launch_takes_the_prestarted_process(modules: tuple[str, ...]) -> None:
    config = resolve_args("--engine-process", "--num-kv-blocks", "64")
    process.prestart(modules)
    pid = _warm_pid()
    engine = create_engine(config)
    assert isinstance(engine, CoreClient)
    await engine.start()
    try:
        assert engine.launcher.pid == pid and not process._warm
        assert engine.health().state == "ready"
    finally:
        await engine.stop()


def test_a_prestarted_process_whose_gateway_is_gone_exits_on_eof() -> None:
    """No atexit runs in a gateway killed by a signal: its end of the pipe closes all the same."""
    process.prestart(("no_such_module_anywhere",))
    proc = process._warm.pop()
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(60) == 0
