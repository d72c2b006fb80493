"""engine/builtin/fp8_gemm_table.py: which FP8 GEMM a step of N rows gets, and that every config
of the table fits Hopper's shared memory and the kernel's tile rules (a config that does not
would fail only when a GPU first ran it)."""

from __future__ import annotations

import pytest

from trtllm_gateway.engine.builtin.fp8_gemm_table import (
    CONFIGS,
    HOPPER_SHARED_BYTES,
    Config,
    config_for,
    shared_bytes,
)

QKV, O_PROJ, GATE_UP, DOWN = (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)


def test_the_table_has_llama_8b_projections_with_rows_ascending() -> None:
    assert set(CONFIGS) == {QKV, O_PROJ, GATE_UP, DOWN}
    for entries in CONFIGS.values():
        most = [m for m, _ in entries]
        assert most == sorted(set(most)) and most[0] > 16 and most[-1] == 8192
        # decode's steps (17-256 rows), then cuBLASLt to 896, then prefill's chunks
        assert [m for m in most if m > 256] == [896, 8192]


@pytest.mark.parametrize(
    ("rows", "shape", "want"),
    [
        (17, O_PROJ, Config(64, 64, 256, 6, 4)),  # past the skinny kernel's 16 rows
        (128, O_PROJ, Config(64, 64, 256, 6, 4)),
        (129, O_PROJ, Config(64, 128, 256, 4, 4)),
        (256, DOWN, Config(64, 128, 256, 4, 4)),
        (64, GATE_UP, Config(64, 256, 128, 4, 4)),
        (100, GATE_UP, None),  # cuBLASLt measured faster at 128 rows
        (200, GATE_UP, Config(128, 256, 128, 4, 8, flatten=True)),
        (193, QKV, None),  # cuBLASLt at 256 rows
        (257, O_PROJ, None),  # past decode's rows: cuBLASLt
        (896, GATE_UP, None),
        (897, DOWN, Config(128, 256, 128, 3, 8, flatten=True)),  # prefill's chunks
        (8192, QKV, Config(128, 256, 128, 3, 8, flatten=True)),
        (8193, O_PROJ, None),  # past the table: cuBLASLt
        (64, (4096, 4097), None),  # a shape not measured
        (64, (576, 576), None),
    ],
)
def test_config_for_picks_by_rows_and_shape(
    rows: int, shape: tuple[int, int], want: Config | None
) -> None:
    assert config_for(rows, *shape) == want


def configs() -> list[Config]:
    return [c for entries in CONFIGS.values() for _, c in entries if c is not None]


@pytest.mark.parametrize("config", configs(), ids=str)
def test_each_config_fits_the_kernel(config: Config) -> None:
    c = config
    # tl.arange's ranges are powers of two; the e4m3 wgmma takes 64-row tiles and K in 32s
    for block in (c.block_m, c.block_n, c.block_k):
        assert block & (block - 1) == 0, c
    assert c.block_m >= 64 and c.block_k >= 32 and c.warps in (4, 8) and c.stages >= 2
    assert c.warps == 4 * (c.block_m // 64) or c.warps == 8  # a warpgroup a 64 rows
    assert shared_bytes(c) <= HOPPER_SHARED_BYTES, (c, shared_bytes(c))


@pytest.mark.parametrize(
    ("config", "compiled"),
    [
        # Triton 3.6's shared memory for sm_90 (triton.compile of the kernel, 2026-11-29)
        (Config(64, 64, 256, 6, 4), 196_656),
        (Config(64, 128, 256, 4, 4), 196_640),
        (Config(128, 128, 128, 5, 8), 163_880),
        (Config(64, 256, 128, 4, 4), 163_872),
        (Config(128, 256, 128, 4, 8, flatten=True), 229_408),
        (Config(64, 128, 256, 4, 4, flatten=True), 204_832),
        (Config(128, 256, 128, 3, 8, flatten=True), 180_248),
    ],
)
def test_shared_bytes_bounds_what_triton_compiled(config: Config, compiled: int) -> None:
    assert compiled <= shared_bytes(config) <= compiled + 64
