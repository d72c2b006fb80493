"""Start-up never hangs (issue 23), with real processes, the real compiler and the real model:
a CPU-kernel build killed with SIGKILL does not block the next start, and a start that cannot
get ready says what it waits on in /health and its log, then exits 4 at --startup-timeout."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.server import ROOT, Server
from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.model_source import resolve_model

ARGS = ["--num-kv-blocks", "128"]


@pytest.fixture
def fresh_cache(tmp_path: Path) -> Path:
    """An empty kernel cache beside the already converted model (hard links, no reconversion)."""
    model = resolve_model("default")
    root = tmp_path / "trtllm-gateway"
    shutil.copytree(model, root / model.name, copy_function=os.link)
    return tmp_path


def _kernel_folder(xdg: Path | None, isa: str | None = None) -> Path:
    """The kernel build folder of `isa` (this CPU's best) under the cache of `xdg` (None: the
    user's)."""
    version = build.compiler_version(build._compiler())
    assert version is not None, "the e2e tests need the C++ compiler the kernels build with"
    old = os.environ.pop("XDG_CACHE_HOME", None)
    if xdg is not None:
        os.environ["XDG_CACHE_HOME"] = str(xdg)
    try:
        return build.build_dir(isa or build.select_isa(), version)
    finally:
        os.environ.pop("XDG_CACHE_HOME", None)
        if old is not None:
            os.environ["XDG_CACHE_HOME"] = old


def _share_build(folder: Path, isa: str) -> None:
    """Copy a finished build into the user's kernel cache, where tests/engine's forced-portable
    runs look for it, so CI compiles that variant once (two cores: about 2.5 minutes each)."""
    shared = _kernel_folder(None, isa)
    if shared.exists():
        return
    shared.parent.mkdir(parents=True, exist_ok=True)
    tmp = shared.with_name(f"{shared.name}.tmp-copy-{os.getpid()}")
    shutil.copytree(folder, tmp)
    try:
        tmp.rename(shared)
    except OSError:  # another process put it there first
        shutil.rmtree(tmp, ignore_errors=True)


COMPILERS = {"cc1plus", "c++", "g++", "clang++", "clang"}  # GCC's driver and compiler proper, clang


def _compiling(pid: int) -> bool:
    """Whether a C++ compiler (GCC's driver or cc1plus, which writes the object file, or
    clang) runs under `pid`."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return False
    names = set()
    for child in children:
        with contextlib.suppress(psutil.Error):
            names.add(child.name())
    return bool(names & COMPILERS)


def _core_pids(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"engine core process (\d+) started", log)]


@pytest.fixture
def held_lock(fresh_cache: Path) -> Iterator[Path]:
    """A live process holding the kernel build's lock (a build that never ends)."""
    folder = _kernel_folder(fresh_cache)
    folder.parent.mkdir(parents=True)
    lock = folder.with_name(folder.name + ".lock")
    with lock.open("a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.write("424242\n")
        f.flush()
        yield lock


# The test lasts this long at least, and the core must reach the kernel build's lock before it:
# 6 s after the start at load ~3 on the 2-core EPYC, 5 s here idle, but 18-21 s after at load
# 9-11 (at load 15 not within 30 s either: the model was still loading). So a first start gives
# up after QUICK_TIMEOUT_S, and only where its core was not waiting on the lock by then (its
# timeout says "still loading the model": nothing of the behaviour under test had happened yet)
# a second start on the same cache gets STARTUP_TIMEOUT_S (30 s: 33-36 s in CI and here; 20 s:
# 25.6 s against 36.1 at load 9-11, run back to back). Every assertion runs on the last start.
QUICK_TIMEOUT_S = 10
STARTUP_TIMEOUT_S = 20
WAITING = "waiting for another process's CPU kernel build"
STILL_BUILDING = "s), still building CPU kernels"  # what the timeout says of the core's state


def _start_until_exit(fresh_cache: Path, log_dir: Path, timeout_s: int) -> tuple[Server, int, str]:
    """A start with --startup-timeout `timeout_s`, /health polled until it exits: the server,
    its exit code and the last 'building' message /health gave."""
    env = {"XDG_CACHE_HOME": str(fresh_cache)}
    args = [*ARGS, "--startup-timeout", str(timeout_s)]
    srv = Server(args=args, env=env).start(log_dir, wait=False)
    seen = ""
    deadline = time.monotonic() + timeout_s + 130
    try:
        assert srv.proc is not None
        while srv.proc.poll() is None and time.monotonic() < deadline:
            try:
                r = httpx.get(f"{srv.url}/health", timeout=2)
                assert r.status_code == 503
                seen = r.json()["error"]["message"] if "building" in r.text else seen
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        code = srv.proc.wait(30)
    finally:
        srv.kill()
    return srv, code, seen


def test_a_start_that_cannot_get_ready_says_why_then_exits_4(
    fresh_cache: Path, held_lock: Path, log_dir: Path
) -> None:
    timeout_s = QUICK_TIMEOUT_S
    srv, code, seen = _start_until_exit(fresh_cache, log_dir, timeout_s)
    if code == 4 and STILL_BUILDING not in srv.log():  # gave up before the core got to the lock
        # (a loaded machine: "still loading the model"): once more, with the longer timeout
        timeout_s = STARTUP_TIMEOUT_S
        srv, code, seen = _start_until_exit(fresh_cache, log_dir, timeout_s)
    assert code == 4, srv.log()
    assert not any(  # the core and everything it started are gone
        Path(f"/proc/{pid}").exists() for pid in _core_pids(srv.log())
    ), srv.log()
    assert "building CPU kernels" in seen
    log = srv.log()
    assert WAITING in log and str(held_lock) in log
    assert "pid 424242" in log
    assert f"(--startup-timeout {timeout_s} s), still building CPU kernels" in log
    # Nothing to drain in a core that never got ready: it is stopped within a second or so, not
    # after the 10 s grace a ready core gets (engine/transport/client.py, stop()).
    stamps = {
        key: dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in log.splitlines()
        for key in ("not ready after", "Finished server process")
        if key in line
    }
    assert (stamps["Finished server process"] - stamps["not ready after"]).total_seconds() < 6


def test_a_build_killed_mid_compile_does_not_block_the_next_start(
    fresh_cache: Path, log_dir: Path
) -> None:
    """kill -9 of a first start's build (the whole process group, as a container stop does),
    then a server on the same cache: it builds again and becomes ready. The portable variant
    (GATEWAY_CPU_ISA) builds here: its finished folder then serves tests/engine's portable runs."""
    folder = _kernel_folder(fresh_cache, "portable")
    isa_env = {"XDG_CACHE_HOME": str(fresh_cache), build.ISA_ENV: "portable"}
    env = {**os.environ, **isa_env}
    first = subprocess.Popen(
        [sys.executable, "-m", "trtllm_gateway.engine.builtin.cpu_kernels.build"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not (list(folder.parent.glob(folder.name + ".tmp-*/*.ninja")) and _compiling(first.pid)):
        assert first.poll() is None and time.monotonic() < deadline, "the build never started"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # mid-compile: a compiler is running
    first.wait()
    assert folder.with_name(folder.name + ".lock").exists() and not folder.exists()
    srv = Server(args=ARGS, env=isa_env)
    try:
        srv.start(log_dir, ready_timeout=1200)
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    finally:
        assert srv.stop() == 0, srv.log()
    log = srv.log()
    assert "building the CPU kernels" in log and "built the CPU kernels in" in log
    assert folder.is_dir() and not list(folder.parent.glob(folder.name + ".tmp-*"))
    assert "the portable variant" in log
    _share_build(folder, "portable")
