"""Settings splits into the parts each subsystem owns (config/gateway.py): every flag in exactly
one part, flags and GATEWAY_* env reaching it, what was given still known to the part."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from tests.configs import resolve_args
from trtllm_gateway.config.settings import PARTS, Settings


def test_every_flag_belongs_to_exactly_one_part() -> None:
    owners: dict[str, list[str]] = {}
    for part in PARTS:
        for name in part.model_fields:
            owners.setdefault(name, []).append(part.__name__)
    assert {name: parts for name, parts in owners.items() if len(parts) > 1} == {}
    assert set(owners) == set(Settings.model_fields)


def test_flags_and_env_reach_their_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MAX_IMAGE_BYTES", "1234")
    config = resolve_args(
        "--port", "9", "--max-logprobs", "3", "--max-batch-size", "4", "--tensor-parallel-size",
        "2", "--prefill-url", "http://p", "--mode", "decode",
    )  # fmt: skip
    assert config.server.port == 9
    assert config.serving.max_logprobs == 3
    assert config.engine.max_batch_size == 4 and config.mode == "decode"
    assert config.trtllm.tensor_parallel_size == 2
    assert config.disagg.prefill_url == ["http://p"]
    assert config.media.max_image_bytes == 1234


def test_a_part_knows_what_was_given() -> None:
    """TensorRT-LLM gets some flags only if given (engine_args): the part must still say so."""
    config = resolve_args("--max-num-tokens", "2048", "--enable-chunked-prefill")
    assert config.engine.model_fields_set == {"max_num_tokens"}
    assert config.trtllm.model_fields_set == {"enable_chunked_prefill"}
    assert resolve_args().engine.model_fields_set == set()


def test_parts_are_frozen_and_picklable() -> None:
    config = resolve_args("--api-key", "k")
    with pytest.raises(ValidationError):
        config.engine.max_batch_size = 2  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(config.engine)) == config.engine


def test_cross_part_checks_stay_on_settings() -> None:
    with pytest.raises(ValidationError, match="--lora-modules needs --engine trtllm"):
        resolve_args("--lora-modules", "a=/x")
    with pytest.raises(ValidationError, match="prefill"):
        resolve_args("--prefill-url", "http://a", "--prefill-pools", "0-10=http://b")
