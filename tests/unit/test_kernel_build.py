"""The CPU-kernel build's cache and lock (issue 23): a killed build never blocks a later start,
a live one is waited on with a log line and a bound, and the key follows what changes the build.

These replace the compiler with a stand-in that writes the module file; the real compiler after
a real kill -9 is tests/e2e/test_startup.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from trtllm_gateway.engine.builtin.cpu_kernels import build


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "trtllm-gateway" / "kernels"


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each stand-in compile: records the variant and writes the module file into the private
    build folder it is given, as torch's builder does."""
    calls: list[str] = []

    def fake_compile(_ext: ModuleType, isa: str, tmp: Path) -> None:
        calls.append(isa)
        (tmp / f"{build._MODULE}_{isa}.so").write_bytes(b"\x7fELF stand-in")

    monkeypatch.setattr(build, "_compile", fake_compile)
    return calls


def _hold_lock(lock: Path, leave_tmp: Path | None = None) -> subprocess.Popen[bytes]:
    """Another process that takes the build lock the way build.py does, then sleeps (a build
    in progress); optionally with a half-written private folder."""
    code = textwrap.dedent(
        f"""
        import fcntl, os, pathlib, sys, time
        f = open({str(lock)!r}, "a+")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.seek(0); f.truncate(); f.write(f"{{os.getpid()}}\\n"); f.flush()
        tmp = {str(leave_tmp) if leave_tmp else ""!r}
        if tmp:
            pathlib.Path(tmp).mkdir(parents=True)
            (pathlib.Path(tmp) / "half.o").write_bytes(b"partial")
        print("locked", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"locked"
    return proc


def test_a_build_killed_with_sigkill_leaves_nothing_that_blocks(
    cache: Path, compiles: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    folder = build.build_dir("avx2", "c++ 1.0")
    folder.parent.mkdir(parents=True)
    lock = folder.with_name(folder.name + ".lock")
    leftover = folder.with_name(folder.name + ".tmp-killed")
    holder = _hold_lock(lock, leave_tmp=leftover)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert lock.exists() and leftover.exists()  # what the kill left behind
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        build._build_once("avx2", folder)
    assert time.monotonic() - started < 5
    assert compiles == ["avx2"]
    assert build._module_path(folder, "avx2").is_file()
    assert not leftover.exists()  # the killed build's half-written folder is gone
    assert "building the CPU kernels" in caplog.text and str(folder) in caplog.text
    assert "built the CPU kernels in" in caplog.text


def test_a_live_build_is_waited_on_with_the_path_logged_then_given_up(
    cache: Path,
    compiles: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    folder = build.build_dir("avx2", "c++ 1.0")
    folder.parent.mkdir(parents=True)
    lock = folder.with_name(folder.name + ".lock")
    holder = _hold_lock(lock)
    monkeypatch.setattr(build, "BUILD_WAIT_S", 1.0)
    try:
        with caplog.at_level(logging.INFO):
            build._build_once("avx2", folder)
    finally:
        holder.kill()
        holder.wait()
    assert compiles == []  # never two builders of one folder
    assert f"lock {lock}, pid {holder.pid}" in caplog.text
    assert "gave up after" in caplog.text and str(holder.pid) in caplog.text
    # The holder is gone now: the next start builds at once.
    build._build_once("avx2", folder)
    assert compiles == ["avx2"]


def test_a_finished_build_is_imported_without_building(
    cache: Path, compiles: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cached folder is used as it is: no compiler, no ninja, no lock (a warm start)."""
    monkeypatch.setattr(build, "compiler_version", lambda _cxx: "c++ 1.0")
    imported: list[Path] = []
    module = SimpleNamespace(simd_path=lambda: "avx2", q8_path=lambda: "avx2")  # what it reports
    monkeypatch.setattr(build, "_import", lambda _name, path: imported.append(path) or module)
    assert build.block_gemm.__wrapped__("avx2") is module
    assert compiles == ["avx2"] and build.is_built("avx2")
    assert build.block_gemm.__wrapped__("avx2") is module
    assert compiles == ["avx2"]  # the second start imported the cached module
    assert (
        imported[0] == imported[1] == build._module_path(build.build_dir("avx2", "c++ 1.0"), "avx2")
    )


def test_the_cache_key_covers_the_torch_install_the_compiler_and_the_variant(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = build.build_dir("avx2", "c++ 12.2")
    assert base == build.build_dir("avx2", "c++ 12.2")
    assert base.name.startswith("cpu-avx2-")
    assert build.build_dir("avx2", "c++ 13.1") != base
    assert build.build_dir("portable", "c++ 12.2") != base
    # A second virtualenv: the same torch version installed elsewhere.
    import torch

    monkeypatch.setattr(torch, "__file__", "/elsewhere/venv2/site-packages/torch/__init__.py")
    assert build.build_dir("avx2", "c++ 12.2") != base


def test_no_compiler_says_so_once_and_keeps_dense(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CXX", str(cache / "no-such-compiler"))
    with caplog.at_level(logging.WARNING):
        assert build.block_gemm.__wrapped__("avx2") is None
    assert "no C++ compiler" in caplog.text and "slower dense float32 path" in caplog.text
    assert not build.is_built("avx2")


def test_the_variant_follows_the_cpu_and_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    avx2_only = frozenset({"sse2", "avx", "avx2", "fma", "f16c", "bmi2"})
    assert build.supported(avx2_only) == ["avx2", "portable"]
    vnni = avx2_only | build.ISAS["avx512"].requires
    assert build.supported(vnni)[0] == "avx512"
    assert build.supported(frozenset()) == ["portable"]
    monkeypatch.setattr(build, "cpu_flags", lambda: avx2_only)
    monkeypatch.delenv(build.ISA_ENV, raising=False)
    assert build.select_isa() == "avx2"
    monkeypatch.setenv(build.ISA_ENV, "portable")
    assert build.select_isa() == "portable"
    monkeypatch.setenv(build.ISA_ENV, "avx512")
    with pytest.raises(ValueError, match="lacks"):
        build.select_isa()
    monkeypatch.setenv(build.ISA_ENV, "sse9")
    with pytest.raises(ValueError, match="expected one of"):
        build.select_isa()


def test_avx_vnni_cpus_get_their_variant_and_the_log_says_what_the_cpu_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    avx2 = frozenset({"sse2", "avx", "avx2", "fma", "f16c", "bmi2"})
    assert build.supported(avx2 | {"avx_vnni"}) == ["avxvnni", "avx2", "portable"]
    assert "-mavxvnni" in build.ISAS["avxvnni"].flags
    monkeypatch.setattr(build, "cpu_flags", lambda: avx2)
    monkeypatch.delenv(build.ISA_ENV, raising=False)
    why = build._why(build.select_isa())
    assert why.startswith("the best this CPU runs; not avx512 (no avx512_vnni, avx512bw, ")
    assert why.endswith("avxvnni (no avx_vnni)")
