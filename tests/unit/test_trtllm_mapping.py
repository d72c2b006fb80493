"""Pure mappings of the TensorRT-LLM adapter: finish reasons, logprobs, disagg codec, loader."""

from __future__ import annotations

import base64
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from trtllm_gateway.engine.protocol import DisaggParams, InvalidRequestError
from trtllm_gateway.engine.trtllm import disagg
from trtllm_gateway.engine.trtllm.llm_args import prune_for_autodeploy
from trtllm_gateway.engine.trtllm.loader import TrtllmNotInstalledError, import_trtllm
from trtllm_gateway.engine.trtllm.outputs import LOGPROB_FLOOR, map_finish_reason, map_logprobs


@dataclass
class Lp:
    logprob: float
    rank: int | None = None


@pytest.mark.parametrize(
    ("reason", "mapped"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("cancelled", "abort"),
        ("timeout", "abort"),
        ("not_finished", None),
        (None, None),
    ],
)
def test_finish_reasons(reason: str | None, mapped: str | None) -> None:
    assert map_finish_reason(reason) == mapped


def test_logprobs_dict_form_sorted_by_rank_and_limited() -> None:
    entry = {7: Lp(-0.5, 2), 3: Lp(-0.1, 1), 9: Lp(-3.0, 3)}
    (lp,) = map_logprobs([entry], [7], top_k=2)
    assert lp.token_id == 7
    assert lp.logprob == -0.5
    assert lp.top == ((3, -0.1), (7, -0.5))


def test_logprobs_sampled_token_missing_is_unknown_and_inf_is_floored() -> None:
    """The sampled token outside the returned top k (TorchSampler adds none): NaN, unknown."""
    (lp,) = map_logprobs([{3: Lp(float("-inf"), 1)}], [4], top_k=1)
    assert math.isnan(lp.logprob)
    assert lp.top == ((3, LOGPROB_FLOOR),)


def test_logprobs_flat_legacy_form() -> None:
    lps = map_logprobs([-0.25, -1.5], [10, 11], top_k=0)
    assert [(lp.token_id, lp.logprob, lp.top) for lp in lps] == [(10, -0.25, ()), (11, -1.5, ())]


@dataclass
class FakeCtxParams:
    request_type: str = "context_only"
    first_gen_tokens: list[int] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None


def test_context_state_round_trips_with_base64_opaque_state() -> None:
    raw = bytes(range(256))
    packed = disagg.pack_context(FakeCtxParams("context_only", [42], 7, raw, [1, 2]), "length")
    body = json.loads(packed)
    assert base64.b64decode(body["encoded_opaque_state"]) == raw
    state = disagg.unpack_context(DisaggParams("generation_only", opaque_state=packed))
    assert (state.ctx_request_id, state.first_gen_tokens, state.opaque_state) == (7, (42,), raw)
    assert state.draft_tokens == (1, 2)
    assert state.finish_reason == "length"


@pytest.mark.parametrize("data", [None, b"", b"\xff\xfe", b"{}", b'{"format": "x"}'])
def test_unpack_rejects_foreign_state(data: bytes | None) -> None:
    with pytest.raises(InvalidRequestError):
        disagg.unpack_context(DisaggParams("generation_only", opaque_state=data))


def test_prune_for_autodeploy_warns_once_per_field(caplog: pytest.LogCaptureFixture) -> None:
    args: dict[str, Any] = {"model": "m", "tensor_parallel_size": 2, "scheduler_config": {}}
    pruned = prune_for_autodeploy(args)
    assert pruned == {"model": "m"}
    assert "tensor_parallel_size" in args  # the input is not modified
    messages = [r.getMessage() for r in caplog.records]
    assert sum("tensor_parallel_size" in m for m in messages) == 1
    assert sum("scheduler_config" in m for m in messages) == 1


def test_missing_tensorrt_llm_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    with pytest.raises(TrtllmNotInstalledError) as info:
        import_trtllm()
    message = str(info.value)
    assert "\n" not in message
    assert "nvcr.io/nvidia/tensorrt-llm/release" in message
    assert "pip install" in message


def test_engine_module_imports_without_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    import importlib

    module = importlib.import_module("trtllm_gateway.engine.trtllm.engine")
    from trtllm_gateway.config.engine import EngineConfig
    from trtllm_gateway.config.trtllm import TrtllmConfig

    with pytest.raises(TrtllmNotInstalledError):
        module.TrtllmEngine(EngineConfig(engine="trtllm", model="/m"), TrtllmConfig())
