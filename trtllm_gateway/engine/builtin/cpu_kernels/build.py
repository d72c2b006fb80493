"""Compile and import the CPU kernels once per install; never block on what a killed build left.

One build per instruction-set variant (ISAS), cached under the gateway's cache directory in a
folder keyed by everything that changes the binary: the sources, the variant's compiler flags,
torch's version and install path, the Python ABI and the C++ compiler's version. So two
virtualenvs (two torch installs) keep two builds instead of rebuilding each other's, and a start
that finds its folder imports the module without running the compiler or ninja at all.

A build runs in a private temporary folder while holding an flock on `<folder>.lock`; the
kernel drops that lock when its holder dies (SIGKILL, OOM, a container stop), so a leftover lock
file never blocks, and a leftover temporary folder is deleted by the next build. The finished
folder is renamed into place, so a half-written build is never imported. A start that waits on
another process's build logs it every LOCK_LOG_S and gives up after BUILD_WAIT_S (dense matmuls).

  python -m trtllm_gateway.engine.builtin.cpu_kernels.build          # the variant this CPU runs
  python -m trtllm_gateway.engine.builtin.cpu_kernels.build --all    # every x86 variant (images)
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO

import torch

from trtllm_gateway.engine.model_source import cache_root

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [
    HERE / n
    for n in (
        "bindings.cpp",
        "block_gemm.cpp",
        "decode_attention.cpp",
        "decode_stack.cpp",
        "fused_ops.cpp",
        "q8_gemm.cpp",
        "rms_norm.cpp",
    )
]
ISA_ENV = "GATEWAY_CPU_ISA"
BUILD_WAIT_S = float(os.environ.get("GATEWAY_KERNEL_BUILD_WAIT_S", "1200"))
LOCK_LOG_S = 30.0
_MODULE = "trtllm_gateway_cpu_kernels"


@dataclass(frozen=True, slots=True)
class Isa:
    """A build variant: its compiler flags and the /proc/cpuinfo flags a CPU needs to run it."""

    flags: tuple[str, ...]
    requires: frozenset[str]


# Best first. Explicit feature lists, not -march=native: a build is valid on every CPU with the
# listed flags, so an image can build them all ahead of time on whatever machine builds it.
ISAS: dict[str, Isa] = {
    "avx512": Isa(
        (
            "-march=haswell",
            "-mavx512f",
            "-mavx512bw",
            "-mavx512vl",
            "-mavx512dq",
            "-mavx512cd",
            "-mavx512vnni",
        ),
        frozenset(
            {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
            | {"avx512_vnni"}
        ),
    ),
    # AVX2 CPUs with AVX-VNNI (Intel client CPUs since Alder Lake): the int8 matmul's 256-bit
    # vpdpbusd instead of vpmaddubsw + vpmaddwd; the float kernels are avx2's.
    "avxvnni": Isa(
        ("-march=haswell", "-mavxvnni"), frozenset({"avx2", "fma", "f16c", "bmi2", "avx_vnni"})
    ),
    "avx2": Isa(("-march=haswell",), frozenset({"avx2", "fma", "f16c", "bmi2"})),
    "portable": Isa(("-march=x86-64",), frozenset()),
}


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as /proc/cpuinfo names them (empty where it is not readable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def supported(flags: frozenset[str] | None = None) -> list[str]:
    """The variants this CPU can run, best first."""
    have = cpu_flags() if flags is None else flags
    return [name for name, isa in ISAS.items() if isa.requires <= have]


def select_isa() -> str:
    """GATEWAY_CPU_ISA when set (it must name a variant this CPU runs), else the best one."""
    runnable = supported()
    asked = os.environ.get(ISA_ENV, "").strip()
    if not asked:
        return runnable[0]
    if asked not in ISAS:
        raise ValueError(f"{ISA_ENV}={asked!r}: expected one of {', '.join(ISAS)}")
    if asked not in runnable:
        raise ValueError(f"{ISA_ENV}={asked}: this CPU lacks {sorted(ISAS[asked].requires)}")
    return asked


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


@functools.cache
def compiler_version(cxx: str) -> str | None:
    """The first line of `cxx --version`, or None when there is no such compiler."""
    try:
        out = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def build_dir(isa: str, cxx_version: str) -> Path:
    """The cache folder of one variant for this torch install, Python and compiler."""
    h = hashlib.sha256()
    for part in (
        isa,
        " ".join(ISAS[isa].flags),
        torch.__version__,
        str(Path(torch.__file__).resolve().parent),
        str(sysconfig.get_config_var("EXT_SUFFIX")),
        cxx_version,
    ):
        h.update(part.encode() + b"\0")
    for f in sorted(HERE.glob("*.[ch]*")):
        h.update(f.name.encode() + f.read_bytes())
    return cache_root(None) / "kernels" / f"cpu-{isa}-{h.hexdigest()[:16]}"


def _module_path(folder: Path, isa: str) -> Path:
    return folder / f"{_MODULE}_{isa}.so"  # the name torch's extension builder writes


def is_built(isa: str | None = None) -> bool:
    """Whether a start would import a finished build (False: it would compile, or cannot)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        isa = isa or select_isa()
    except ValueError:
        return False
    version = compiler_version(_compiler())
    return version is not None and _module_path(build_dir(isa, version), isa).is_file()


@functools.cache
def block_gemm(isa: str | None = None) -> ModuleType | None:
    """The compiled module (q4_1_mm, q8_0_mm, decode_attention, rms_norm, ...) of `isa` (default:
    select_isa()), built first if need be; None when it cannot be had (the reason is logged)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        logger.info("CPU kernels are x86-64 only; dense float32 matmuls on %s", platform.machine())
        return None
    try:
        isa = isa or select_isa()
    except ValueError as e:
        logger.warning("CPU kernels not used: %s", e)
        return None
    path = ensure_built(isa)
    if path is None:
        return None
    try:
        module = _import(f"{_MODULE}_{isa}", path)
    except Exception as e:
        logger.warning("CPU kernels unavailable (%s); using dense float32 matmuls", _first(e))
        return None
    logger.info(
        "CPU kernels: the %s variant (%s; float kernels %s, int8 dot products %s) from %s",
        isa,
        _why(isa),
        module.simd_path(),
        module.q8_path(),
        path.parent,
    )
    return module


def _why(isa: str) -> str:
    if os.environ.get(ISA_ENV, "").strip():
        return f"{ISA_ENV}={isa}"
    missing = [
        f"{name} (no {', '.join(sorted(ISAS[name].requires - cpu_flags()))})"
        for name in list(ISAS)[: list(ISAS).index(isa)]
    ]
    return "the best this CPU runs" + (f"; not {', '.join(missing)}" if missing else "")


def ensure_built(isa: str) -> Path | None:
    """The built module file of `isa` (compiled now if no finished build is cached), or None."""
    cxx = _compiler()
    version = compiler_version(cxx)
    if version is None:
        logger.warning(
            "no C++ compiler (%s) to build the CPU kernels: the slower dense float32 path "
            "(install g++, or set CXX)",
            cxx,
        )
        return None
    folder = build_dir(isa, version)
    path = _module_path(folder, isa)
    try:
        if not path.is_file():
            _build_once(isa, folder)
    except Exception as e:  # a missing header or a broken compiler shows up as many errors
        logger.warning("CPU kernels unavailable (%s); using dense float32 matmuls", _first(e))
        logger.debug("CPU kernel build failure", exc_info=True)
        return None
    return path if path.is_file() else None


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_once(isa: str, folder: Path) -> None:
    """Build `folder` unless another process does; at most one builder per folder at a time."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock_path = folder.with_name(folder.name + ".lock")
    with open(lock_path, "a+") as lock:
        if not _acquire(lock, lock_path):
            return
        try:
            if _module_path(folder, isa).is_file():  # built while this one waited
                return
            lock.seek(0)
            lock.truncate()
            lock.write(f"{os.getpid()}\n")
            lock.flush()
            _build(isa, folder)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _acquire(lock: IO[str], lock_path: Path) -> bool:
    """flock the open lock file, waiting at most BUILD_WAIT_S; log what it waits on."""
    start = time.monotonic()
    next_log = start
    while True:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now - start > BUILD_WAIT_S:
            logger.warning(
                "gave up after %.0f s waiting for the CPU kernel build lock %s (held by pid %s); "
                "dense float32 matmuls this time",
                now - start,
                lock_path,
                _holder(lock_path),
            )
            return False
        if now >= next_log:
            logger.info(
                "waiting for another process's CPU kernel build (%.0f s so far; lock %s, pid %s)",
                now - start,
                lock_path,
                _holder(lock_path),
            )
            next_log = now + LOCK_LOG_S
        time.sleep(0.2)


def _holder(lock_path: Path) -> str:
    try:
        return lock_path.read_text().strip() or "?"
    except OSError:
        return "?"


def _build(isa: str, folder: Path) -> None:
    import ninja
    from torch.utils import cpp_extension

    # Whatever a killed build left (only the lock holder builds, so none of these is live).
    for stale in folder.parent.glob(folder.name + ".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    # torch runs `ninja` from PATH; the venv's copy is not on it unless the venv is active.
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    logger.info(
        "building the CPU kernels (%s variant; about 1 minute on two idle cores, several on a "
        "loaded machine; once per install) in %s",
        isa,
        folder,
    )
    started = time.monotonic()
    try:
        _compile(cpp_extension, isa, tmp)
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("built the CPU kernels in %.0f s: %s", time.monotonic() - started, folder)


def _compile(cpp_extension: ModuleType, isa: str, tmp: Path) -> None:
    """Compile without importing: a variant this CPU cannot run (an image built for any x86
    CPU) must not be loaded, since its own initializers may use those instructions. torch has no
    public build-only entry point; its loader's first half is used where it has this shape."""
    name = f"{_MODULE}_{isa}"
    sources = [str(f) for f in SOURCES]
    cflags = ["-O3", "-fopenmp", *ISAS[isa].flags]
    build_only = getattr(cpp_extension, "_write_ninja_file_and_build_library", None)
    if build_only is not None:
        try:
            build_only(
                name=name,
                sources=sources,
                extra_cflags=cflags,
                extra_cuda_cflags=None,
                extra_sycl_cflags=None,
                extra_ldflags=None,
                extra_include_paths=None,
                build_directory=str(tmp),
                verbose=False,
                with_cuda=False,
                with_sycl=False,
            )
            return
        except TypeError:  # another torch's signature
            logger.debug("torch's build-only entry point differs; building with load()")
    if isa not in supported():
        raise RuntimeError(f"this torch cannot build the {isa} variant without loading it")
    cpp_extension.load(
        name=name, sources=sources, extra_cflags=cflags, build_directory=str(tmp), verbose=False
    )


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if platform.machine() not in ("x86_64", "AMD64"):
        logger.info("CPU kernels are x86-64 only; nothing to build on %s", platform.machine())
        return 0
    names = list(ISAS) if "--all" in argv else [select_isa()]
    built = [isa for isa in names if ensure_built(isa) is not None]
    for isa in built:
        logger.info("CPU kernels built: %s", isa)
    return 0 if built == names else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
