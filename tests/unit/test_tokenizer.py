"""engine/tokenizer.py: chat template, bytes for logprobs, incremental detokenizer vs decode."""

from __future__ import annotations

import random

import pytest

from trtllm_gateway.engine.protocol import InvalidRequestError
from trtllm_gateway.engine.tokenizer import Tokenizer

TEXTS = [
    "Hello world, the quick brown fox.",
    "你好世界, こんにちは, 안녕하세요",
    "😀🎉🚀 emoji 👍🏽 mixed with café and naïve",
    "a\u0301 combining, \u200d zero width, 𝕏 astral",
]


def test_encode_chat_uses_template(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    no_prompt = tokenizer.encode_chat([{"role": "user", "content": "hi"}], False)
    assert len(no_prompt) < len(ids)


def test_encode_chat_without_template(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenizer._hf, "chat_template", None)
    with pytest.raises(InvalidRequestError):
        tokenizer.encode_chat([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_concatenate_to_utf8(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode()
    assert tokenizer.token_text(ids[0]) == tokenizer.decode(ids[:1], skip_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_never_splits_characters(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = tokenizer.detokenizer()
    deltas = [detok.add([i]) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


@pytest.mark.parametrize("seed", range(20))
def test_incremental_matches_full_decode_on_random_ids(tokenizer: Tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 40))]
    detok = tokenizer.detokenizer()
    out = []
    i = 0
    while i < len(ids):
        step = rng.randint(1, 3)
        out.append(detok.add(ids[i : i + step]))
        i += step
    out.append(detok.flush())
    assert "".join(out) == tokenizer.decode(ids)


def test_prompt_context_keeps_leading_text(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("Hello", add_special_tokens=False)
    reply = tokenizer.encode(" world 😀", add_special_tokens=False)
    detok = tokenizer.detokenizer(prompt)
    assert "".join(detok.add([i]) for i in reply) + detok.flush() == " world 😀"


@pytest.mark.parametrize("skip_special", [True, False])
def test_decode_equals_transformers_decode(tokenizer: Tokenizer, skip_special: bool) -> None:
    """The streaming path decodes through the Rust tokenizer directly; it must give exactly what
    transformers' decode gives (special tokens, partial UTF-8, spaces)."""
    hf = tokenizer._hf
    rng = random.Random(7)
    specials = sorted(hf.all_special_ids)
    for _ in range(50):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 30))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        expected = hf.decode(ids, skip_special_tokens=skip_special)
        assert tokenizer.decode(ids, skip_special_tokens=skip_special) == expected
