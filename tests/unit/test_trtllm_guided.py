"""Issue 11 on TensorRT-LLM: structured outputs, logit_bias and allowed_token_ids as 1.2 takes
them (GuidedDecodingParams and guided_decoding_backend; SamplingParams.embedding_bias).

The stand-in (tests/standin/tensorrt_llm) masks its scripted tokens with llguidance as
TensorRT-LLM's guided decoder masks logits, and adds embedding_bias to its "logits".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.standin import ensure_on_path
from tests.unit.test_trtllm_engine import _collect, _engine, _ids, _req, model_dir
from trtllm_gateway.engine.protocol import GuidedDecoding, InvalidRequestError

ensure_on_path()

from trtllm_gateway.engine.trtllm.engine import TrtllmEngine  # noqa: E402

__all__ = ["model_dir"]  # the fixture, re-used

SCHEMA = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
LARK = 'start: "yes" | "no"'


async def _guided_engine(model_dir: Path, backend: str | None = "llguidance") -> TrtllmEngine:
    return await _engine(model_dir, guided_decoding_backend=backend)


def _byte_tokenizer_model(tmp_path: Path) -> Path:
    """A model dir with a byte-level tokenizer (256 bytes + </s> = 256), vocab 1000: enough
    for TensorRT-LLM's guided decoder, which is built from the model's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = tmp_path / "byte-model"
    path.mkdir()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)} | {"</s>": len(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>").save_pretrained(path)
    config = {"model_type": "llama", "vocab_size": 1000, "eos_token_id": len(alphabet)}
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 256}))
    return path


@pytest.mark.parametrize(
    ("guided", "field", "value", "pattern"),
    [
        (GuidedDecoding("json", SCHEMA), "json", SCHEMA, r"\{"),
        (GuidedDecoding("json_object"), "json_object", True, r"\{"),
        (GuidedDecoding("regex", "[0-9]{1,4}"), "regex", "[0-9]{1,4}", r"[0-9]{1,4}"),
        (GuidedDecoding("grammar", LARK), "grammar", LARK, r"yes|no"),
    ],
)
async def test_guided_decoding_reaches_the_llm_as_1_2_takes_it(
    tmp_path: Path, guided: GuidedDecoding, field: str, value: object, pattern: str
) -> None:
    """Real: `SamplingParams.guided_decoding = GuidedDecodingParams(...)`, one guide only
    (sampling_params.py), and `LLM(guided_decoding_backend=...)` (llm_args.py); the guided
    decoder masks each step's logits, with llguidance a grammar is Lark (grammar_matcher.py:
    grammar_from_lark). The stand-in masks its scripted tokens with llguidance the same way."""
    import re

    from transformers import AutoTokenizer

    model = _byte_tokenizer_model(tmp_path)
    engine = await _guided_engine(model)
    try:
        events = await _collect(engine.generate(_req(prompt=(65, 66), max_tokens=8, guided=guided)))
        assert engine._llm.args.guided_decoding_backend == "llguidance"
        sent = engine._llm.recorded_requests[-1]["sampling_params"].guided_decoding
        assert type(sent).__module__ == "tensorrt_llm.sampling_params"
        assert getattr(sent, field) == value
        text = AutoTokenizer.from_pretrained(model).decode(_ids(events))
        assert re.match(pattern, text), text
        if field in ("regex", "grammar"):  # short languages: the output is a whole word of it
            assert re.fullmatch(pattern, text) and events[-1].finish_reason == "stop", text
    finally:
        await engine.stop()


async def test_guided_decoding_refusals_name_the_reason(model_dir: Path) -> None:
    """Real: with no guided_decoding_backend no guided decoder exists and a guide is ignored;
    xgrammar reads `grammar` as EBNF; 1.2 has no reasoning-aware start for a guide."""
    plain = await _guided_engine(model_dir, backend=None)
    xgrammar = await _guided_engine(model_dir, backend="xgrammar")
    try:
        with pytest.raises(InvalidRequestError, match="--guided-decoding-backend"):
            await _collect(plain.generate(_req(guided=GuidedDecoding("json_object"))))
        lark = GuidedDecoding("grammar", 'start: "a"')
        with pytest.raises(InvalidRequestError, match=r"Lark grammar needs.*llguidance"):
            await _collect(xgrammar.generate(_req(guided=lark)))
        after = GuidedDecoding("json_object", start_after=(7,))
        with pytest.raises(InvalidRequestError, match="after reasoning"):
            await _collect(xgrammar.generate(_req(guided=after)))
        assert plain._llm.recorded_requests == xgrammar._llm.recorded_requests == []
    finally:
        await plain.stop()
        await xgrammar.stop()


async def test_logit_bias_and_allowed_token_ids_become_embedding_bias(model_dir: Path) -> None:
    """Real: `SamplingParams.embedding_bias`, float32 [vocab_size], added to the logits by the
    PyTorch sampler every step; the stand-in samples from the biased logits."""
    import torch

    engine = await _engine(model_dir)
    try:
        allowed = await _collect(
            engine.generate(_req("a", max_tokens=5, allowed_token_ids=(300, 301)))
        )
        assert set(_ids(allowed)) <= {300, 301}
        bias = engine._llm.recorded_requests[-1]["sampling_params"].embedding_bias
        assert bias.dtype == torch.float32 and bias.shape == (1000,)
        forced = await _collect(engine.generate(_req("b", max_tokens=4, logit_bias=((42, 100.0),))))
        assert _ids(forced) == [42] * 4
        with pytest.raises(InvalidRequestError, match="5000") as exc:
            await _collect(engine.generate(_req("c", logit_bias=((5000, 1.0),))))
        assert exc.value.param == "logit_bias"
    finally:
        await engine.stop()
