"""Compile and import the CPU kernels through torch's C++ extension builder, once per machine.

The build (about 30 s on two cores) is cached under the gateway's cache directory, keyed by the
source, torch's version and this CPU's instruction-set flags (the code is built with
-march=native, so a cache copied to another CPU is not reused). Any failure (no compiler, no
x86 SIMD headers) is logged once and the caller keeps dense matmuls.

  python -m trtllm_gateway.engine.builtin.cpu_kernels.build   # build now (make model does)
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

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
        "fused_ops.cpp",
        "q8_gemm.cpp",
        "rms_norm.cpp",
    )
]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_dir() -> Path:
    h = hashlib.sha256(torch.__version__.encode() + _cpu_flags().encode())
    for f in sorted(HERE.glob("*.[ch]*")):
        h.update(f.name.encode() + f.read_bytes())
    return cache_root(None) / "kernels" / f"cpu-{h.hexdigest()[:16]}"


@functools.cache
def block_gemm() -> ModuleType | None:
    """The compiled module (q4_1_mm, q8_0_mm, decode_attention, rms_norm), or None when it
    cannot be built."""
    if platform.machine() not in ("x86_64", "AMD64"):
        logger.info("CPU kernels are x86-64 only; dense float32 matmuls on %s", platform.machine())
        return None
    try:
        import ninja
        from torch.utils import cpp_extension

        # torch runs `ninja` from PATH; the venv's copy is not on it unless the venv is active.
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        target = build_dir()
        target.mkdir(parents=True, exist_ok=True)
        module: ModuleType = cpp_extension.load(
            name="trtllm_gateway_cpu_kernels",
            sources=[str(f) for f in SOURCES],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            build_directory=str(target),
            verbose=False,
        )
    except Exception as e:  # a missing compiler shows up as many different errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        logger.warning("CPU kernels unavailable (%s); using dense float32 matmuls", first)
        logger.debug("CPU kernel build failure", exc_info=True)
        return None
    return module


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(0 if block_gemm() is not None else 1)
