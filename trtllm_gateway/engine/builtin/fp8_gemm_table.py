"""The configs of kernels/fp8_gemm.py's e4m3 GEMM and when fp8_matmul runs it (no Triton here: the
CPU tests read the table).

A Config is the kernel's tiles, pipeline depth and warps; CONFIGS maps a weight's shape and a
step's row count to the config measured fastest there, or to None where cuBLASLt
(torch._scaled_mm) is as fast or faster. shared_bytes is the shared memory a config asks for, as
Triton 3.6 compiled each config of the table for sm_90 (stages x (BLOCK_M + BLOCK_N) x BLOCK_K
bytes of e4m3 tiles, BLOCK_M x BLOCK_N more with flatten, 48 bytes of barriers at most).
"""

from __future__ import annotations

from typing import NamedTuple

HOPPER_SHARED_BYTES = 232_448  # 227 KiB: the most shared memory a block may ask for on sm_90


class Config(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    stages: int
    warps: int
    group_m: int = 8
    flatten: bool = False


# Prefill's chunks, 897-8,192 rows: 128 x 256 tiles, one loop over tiles and K. A layer's four
# projections, ms, cuBLASLt's sum against this config's (bench/fp8_gemm_rows.py, H200,
# 2026-11-29 calls 34-35): 0.345 / 0.343 at 1,024 rows, 0.680 / 0.663 at 2,048, 1.354 / 1.369
# at 4,096, 2.873 / 2.688 at 8,192 (2.800 / 2.651 in the call before). o_proj and down_proj
# then add into the residual in the GEMM: the separate add it saves was 45 us at 8,192 rows,
# 2.9 ms of an 8,192-token prefill step (of ~119). Below 897 rows o_proj's and down_proj's 16
# columns of 128-row tiles do not fill 132 SMs (0.024 against cuBLASLt's 0.015 ms at 384 and
# 512 rows): cuBLASLt keeps 257-896. Past 8,192 rows (a --max-num-tokens above the default):
# cuBLASLt, not measured.
PREFILL = Config(128, 256, 128, 3, 8, flatten=True)
PREFILL_ROWS = ((896, None), (8192, PREFILL))

# (N, K) of an e4m3 weight -> ((most rows, config or None for cuBLASLt), ...), rows ascending;
# rows past the last entry take cuBLASLt. Llama-3.1-8B's projections, the fastest of 18 configs
# (bench/fp8_gemm_rows.py on an H200, 2026-11-29, weights cycled past L2) where it beat
# torch._scaled_mm at 32, 64, 128, 192 and 256 rows: ms a call, ours against cuBLASLt's;
# then PREFILL_ROWS.
CONFIGS: dict[tuple[int, int], tuple[tuple[int, Config | None], ...]] = {
    # qkv: 0.0098 / 0.0146 at 64 rows, 0.0110 / 0.0144 at 128, 0.0150 / 0.0189 at 192;
    # at 256 cuBLASLt's 0.0143 against 0.0146
    (6144, 4096): (
        (64, Config(64, 64, 256, 6, 4)),
        (128, Config(64, 128, 256, 4, 4)),
        (192, Config(128, 128, 128, 5, 8)),
        *PREFILL_ROWS,
    ),
    # o: 0.0081 / 0.0140 at 64 and 128 rows, 0.0100 / 0.0139 at 256
    (4096, 4096): (
        (128, Config(64, 64, 256, 6, 4)),
        (256, Config(64, 128, 256, 4, 4)),
        *PREFILL_ROWS,
    ),
    # gate_up: 0.0335 / 0.0467 at 64 rows; at 128 cuBLASLt's 0.0361 against 0.0373;
    # 0.0507 / 0.0697 at 192, 0.0521 / 0.0548 at 256; one loop over tiles and K (flatten)
    # 0.0520 against 0.0537 at 256 rows in a second call
    (28672, 4096): (
        (64, Config(64, 256, 128, 4, 4)),
        (128, None),
        (256, Config(128, 256, 128, 4, 8, flatten=True)),
        *PREFILL_ROWS,
    ),
    # down: 0.0196 / 0.0369 at 64 rows, 0.0200 / 0.0367 at 128, 0.0271 / 0.0373 at 256
    (4096, 14336): (
        (128, Config(64, 64, 256, 6, 4)),
        (256, Config(64, 128, 256, 4, 4)),
        *PREFILL_ROWS,
    ),
}


def config_for(rows: int, n: int, k: int) -> Config | None:
    """The measured config for rows x [n, k], None where cuBLASLt is as fast or faster."""
    for most, config in CONFIGS.get((n, k), ()):
        if rows <= most:
            return config
    return None


def shared_bytes(config: Config) -> int:
    """Shared memory the config's kernel asks for (see the module's note)."""
    c = config
    tiles = c.stages * (c.block_m + c.block_n) * c.block_k
    return tiles + (c.block_m * c.block_n if c.flatten else 0) + 48
