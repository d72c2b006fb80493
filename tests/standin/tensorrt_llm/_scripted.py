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


def biased(token_id: int, bias: list[float]) -> int:
    """The token after TensorRT-LLM adds embedding_bias to the logits: a banned (-inf) token
    gives way to the most favoured one, and a bias of +50 or more wins outright."""
    best = max(range(len(bias)), key=lambda t: (bias[t], -t))
    if bias[token_id] == float("-inf") or bias[best] >= 50:
        return best
    return token_id


def logprob_at(token_id: int, position: int, rank: int) -> float:
    return -0.05 - (_h("lp", token_id, position) % 100) / 50.0 - (rank - 1) * 2.5


def sampled_rank(token_id: int, position: int, greedy: bool) -> int:
    """Where the emitted token ranks in the raw distribution: 1 under greedy decoding; when
    sampling, anywhere in 1..30, so it is often outside a top-1 and sometimes outside a top-20."""
    return 1 if greedy else 1 + _h("rank", token_id, position) % 30


def prompt_topk(
    prompt_token_ids: Sequence[int], position: int, k: int, vocab_size: int
) -> list[tuple[int, float]]:
    """The k best (token, logprob) after prompt position `position`, best first.

    The actual next prompt token is among them at even positions only (rank 1 or 2), so a
    mapping that pairs entries with the wrong token, or assumes the token is there, shows.
    """
    nxt = prompt_token_ids[position + 1] if position + 1 < len(prompt_token_ids) else None
    base = _h("ptop", tuple(prompt_token_ids), position)
    ids: list[int] = []
    if nxt is not None and position % 2 == 0:
        ids.append(nxt)
    while len(ids) < k:
        cand = (base + 7919 * len(ids) + 1) % vocab_size
        if cand != nxt and cand not in ids:
            ids.append(cand)
        base += 1
    if len(ids) > 1 and position % 4 == 2:
        ids[0], ids[1] = ids[1], ids[0]  # the actual token at rank 2
    return [(tid, -0.1 - 1.5 * rank - (base % 7) / 10) for rank, tid in enumerate(ids[:k])]


def opaque_state(prompt_token_ids: Sequence[int], ctx_request_id: int) -> bytes:
    """What a context-only request hands over; generation-only checks it against its prompt."""
    digest = hashlib.blake2b(repr(tuple(prompt_token_ids)).encode(), digest_size=16).hexdigest()
    return f"standin-ctx:{ctx_request_id}:{digest}".encode()


def image_embedding(pixels: bytes, tokens: int, hidden: int) -> object:
    """The vision tower's output for one image: [tokens, hidden] float32, from its pixels."""
    import torch

    gen = torch.Generator().manual_seed(_h("img", hashlib.blake2b(pixels).hexdigest()) >> 1)
    return torch.randn(tokens, hidden, generator=gen)


def embedding_token(embedding: object, vocab: int) -> int:
    """The id an image's embedding stands in for in the scripted prompt hash."""
    import torch

    assert isinstance(embedding, torch.Tensor)
    raw = embedding.detach().to(torch.float32).contiguous().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=4).digest(), "little") % vocab
