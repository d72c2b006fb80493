"""The stand-in's "model": deterministic token choice from a hash of the prompt and position."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _h(*parts: object) -> int:
    data = repr(parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def prompt_key(prompt_token_ids: Sequence[int]) -> int:
    return _h("prompt", tuple(prompt_token_ids))


def natural_length(prompt_token_ids: Sequence[int]) -> int:
    """Tokens generated before the end id (16..63)."""
    return 16 + prompt_key(prompt_token_ids) % 48


def token_at(prompt_token_ids: Sequence[int], position: int, vocab_size: int) -> int:
    """Token at a generated position: stays clear of the low ids where special tokens live."""
    low = min(100, vocab_size // 4)
    span = max(1, vocab_size // 2 - low)
    return low + _h("tok", prompt_key(prompt_token_ids), position) % span


def logprob_at(token_id: int, position: int, rank: int) -> float:
    return -0.05 - (_h("lp", token_id, position) % 100) / 50.0 - (rank - 1) * 2.5


def opaque_state(prompt_token_ids: Sequence[int], ctx_request_id: int) -> bytes:
    """What a context-only request hands over; generation-only checks it against its prompt."""
    digest = hashlib.blake2b(repr(tuple(prompt_token_ids)).encode(), digest_size=16).hexdigest()
    return f"standin-ctx:{ctx_request_id}:{digest}".encode()
