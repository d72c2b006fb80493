"""Which CPU-kernel build a start loads (issue 28): the best variant this CPU runs, or the one
GATEWAY_CPU_ISA names, and the start logs which and why, with the paths the build compiled.

The kernels of each variant are checked against dense references in test_packed_linear.py and
test_q8_activations.py (their `kernels` fixture runs the native and the portable build).
"""

from __future__ import annotations

import logging

import pytest

from trtllm_gateway.engine.builtin.cpu_kernels import build


def test_gateway_cpu_isa_forces_the_portable_build_and_the_start_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(build.ISA_ENV, "portable")
    with caplog.at_level(logging.INFO, logger=build.__name__):
        k = build.block_gemm.__wrapped__()
    assert k is not None
    assert (k.simd_path(), k.q8_path(), k.q8_native()) == ("portable", "portable", False)
    assert (
        "CPU kernels: the portable variant (GATEWAY_CPU_ISA=portable; float kernels portable, "
        "int8 dot products portable)" in caplog.text
    )


def test_the_native_build_is_the_variant_the_cpu_flags_select(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On CI's AVX2-only EPYC: avx2, with 'not avx512 (no avx512bw, ...)' in the log."""
    monkeypatch.delenv(build.ISA_ENV, raising=False)
    isa = build.select_isa()
    with caplog.at_level(logging.INFO, logger=build.__name__):
        k = build.block_gemm.__wrapped__()
    assert k is not None
    simd = {"avx512": "avx512", "avxvnni": "avx2", "avx2": "avx2", "portable": "portable"}[isa]
    q8 = {"avx512": "avx512-vnni", "avxvnni": "avx-vnni", "avx2": "avx2"}.get(isa, "portable")
    assert (k.simd_path(), k.q8_path()) == (simd, q8)
    assert f"CPU kernels: the {isa} variant (the best this CPU runs" in caplog.text
    for better in list(build.ISAS)[: list(build.ISAS).index(isa)]:
        assert f"{better} (no " in caplog.text  # each better variant, with what the CPU lacks
