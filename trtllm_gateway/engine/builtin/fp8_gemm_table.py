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


# (N, K) of an e4m3 weight -> ((most rows, config or None for cuBLASLt), ...), rows ascending;
# rows past the last entry take cuBLASLt. Llama-3.1-8B's projections, the fastest of 18 configs
# (bench/fp8_gemm_rows.py on an H200, 2026-11-29, weights cycled past L2) where it beat
# torch._scaled_mm at 32, 64, 128, 192 and 256 rows: ms a call, ours against cuBLASLt's.
CONFIGS: dict[tuple[int, int], tuple[tuple[int, Config | None], ...]] = {
    # qkv: 0.0098 / 0.0146 at 64 rows, 0.0110 / 0.0144 at 128, 0.0150 / 0.0189 at 192;
    # at 256 cuBLASLt's 0.0143 against 0.0146
    (6144, 4096): (
        (64, Config(64, 64, 256, 6, 4)),
        (128, Config(64, 128, 256, 4, 4)),
        (192, Config(128, 128, 128, 5, 8)),
    ),
    # o: 0.0081 / 0.0140 at 64 and 128 rows, 0.0100 / 0.0139 at 256
    (4096, 4096): ((128, Config(64, 64, 256, 6, 4)), (256, Config(64, 128, 256, 4, 4))),
    # gate_up: 0.0335 / 0.0467 at 64 rows; at 128 cuBLASLt's 0.0361 against 0.0373;
    # 0.0507 / 0.0697 at 192, 0.0521 / 0.0548 at 256; one loop over tiles and K (flatten)
    # 0.0520 against 0.0537 at 256 rows in a second call
    (28672, 4096): (
        (64, Config(64, 256, 128, 4, 4)),
        (128, None),
        (256, Config(128, 256, 128, 4, 8, flatten=True)),
    ),
    # down: 0.0196 / 0.0369 at 64 rows, 0.0200 / 0.0367 at 128, 0.0271 / 0.0373 at 256
    (4096, 14336): ((128, Config(64, 64, 256, 6, 4)), (256, Config(64, 128, 256, 4, 4))),
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
