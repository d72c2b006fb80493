"""A sampled row's Philox key: splitmix64 of (request seed, output step), so a seeded request
draws the same tokens whatever shares its batch (kernels/sampling.py takes the key as its seed).
No triton here: the CPU tests check the array form against the scalar one."""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def row_key(seed: int, step: int) -> int:
    """splitmix64 of (seed, step), folded to a non-negative int63 (Philox takes it as the seed)."""
    z = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def row_keys(seeds: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """row_key over arrays (uint64 in, int64 out): numpy's uint64 arithmetic wraps mod 2^64 as
    row_key's masks do, so a row's key is the same whichever way it was computed."""
    u = np.uint64
    with np.errstate(over="ignore"):
        z: np.ndarray = seeds.astype(u) * u(0x9E3779B97F4A7C15)
        z = z + steps.astype(u) * u(0xBF58476D1CE4E5B9) + u(0x94D049BB133111EB)
        z = np.bitwise_xor(z, np.right_shift(z, u(30))) * u(0xBF58476D1CE4E5B9)
        z = np.bitwise_xor(z, np.right_shift(z, u(27))) * u(0x94D049BB133111EB)
        z = np.right_shift(np.bitwise_xor(z, np.right_shift(z, u(31))), u(1))
    return z.astype(np.int64)
