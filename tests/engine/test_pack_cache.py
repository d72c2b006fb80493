"""PackCache (engine/builtin/pack_cache.py): a start reads what an earlier start packed instead of
checking every block again, and gets the same packed tensors; a changed checkpoint, a damaged file
or a pack that does not fit its layer is packed afresh."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType
from torch import nn

from tests.engine.test_packed_linear import gguf_weights
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin import loader
from trtllm_gateway.engine.builtin import packed_linear as pl
from trtllm_gateway.engine.builtin.cpu_kernels import build
from trtllm_gateway.engine.builtin.pack_cache import PackCache
from trtllm_gateway.engine.builtin.packed_linear import PackedLinear, pack_linears
from trtllm_gateway.engine.model_source import resolve_model


class _Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Linear(128, 64, bias=False)  # Q4_1 values: packs
        self.plain = nn.Linear(64, 32, bias=False)  # random floats: stays dense
        with torch.no_grad():
            self.blocks.weight.copy_(gguf_weights(64, 128, GGMLQuantizationType.Q4_1))


@pytest.fixture
def kernels() -> Any:
    k = build.block_gemm()
    assert k is not None, "make model builds the native CPU kernels"
    return k


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"weights")
    return d


def _no_packing(*_: object) -> None:
    raise AssertionError("packed again although the cache had it")


def test_a_second_start_reads_the_packs(
    kernels: Any, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = PackCache(checkpoint, tmp_path / "cache")
    assert cache.load() is None  # nothing yet
    first = _Two()
    counts, packs = pack_linears(first, kernels)
    assert dict(counts) == {"q4_1": 1, "dense": 1}
    cache.save(packs)
    known = PackCache(checkpoint, tmp_path / "cache").load()
    assert known is not None and known.keys() == {"blocks", "plain"} and known["plain"] is None
    monkeypatch.setattr(pl, "pack_q4_1", _no_packing)
    monkeypatch.setattr(pl, "pack_q8_0", _no_packing)
    second = _Two()
    counts2, packs2 = pack_linears(second, kernels, known=known)
    assert counts2 == counts and packs2["blocks"] is known["blocks"]
    a, b = first.blocks, second.blocks
    assert isinstance(a, PackedLinear) and isinstance(b, PackedLinear)
    assert torch.equal(a.qs, b.qs) and torch.equal(a.scales, b.scales)
    assert isinstance(second.plain, nn.Linear)
    x = torch.randn(3, 128)
    assert torch.equal(a(x), b(x))


def test_a_changed_checkpoint_is_another_file(checkpoint: Path, tmp_path: Path) -> None:
    before = PackCache(checkpoint, tmp_path).path
    weights = checkpoint / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert PackCache(checkpoint, tmp_path).path != before
    assert not PackCache(tmp_path / "empty", tmp_path).usable  # no weight files: no cache


def test_a_damaged_file_is_packed_again(
    kernels: Any, checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = PackCache(checkpoint, tmp_path)
    cache.path.parent.mkdir(parents=True)
    cache.path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with caplog.at_level(logging.WARNING):
        assert cache.load() is None
    assert "unreadable" in caplog.text
    _, packs = pack_linears(_Two(), kernels)
    cache.save(packs)
    assert cache.load() is not None


def test_a_pack_that_does_not_fit_its_layer_is_not_used(kernels: Any) -> None:
    _, packs = pack_linears(_Two(), kernels)
    right = packs["blocks"]
    assert right is not None
    qs, scales = right[1]
    wrong = {"blocks": (right[0], (qs[:32], scales[:32])), "plain": None}  # another model's
    model = _Two()
    _, packs2 = pack_linears(model, kernels, known=wrong)
    assert packs2["blocks"] is not wrong["blocks"]
    assert isinstance(model.blocks, PackedLinear) and torch.equal(model.blocks.qs, qs)
    bad_kind = {"blocks": ("q8_0", right[1]), "plain": None}  # a Q4_1 pack called Q8_0
    _, packs3 = pack_linears(_Two(), kernels, known=bad_kind)
    assert packs3["blocks"] is not None and packs3["blocks"][0] == "q4_1"


def test_the_default_model_loads_its_packs_from_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real SmolLM2 load, twice on one cache: the second reads every pack from the file
    (packing would raise) and its layers hold the same tensors as the first's."""
    converted = resolve_model("default")  # the default cache's copy; packs go to tmp_path
    engine = Settings(model=str(converted), cache_dir=tmp_path, num_kv_blocks=8).parts().engine
    with caplog.at_level(logging.INFO, logger=loader.__name__):
        first = loader.load(engine)
    assert "packed now" in caplog.text
    caplog.clear()
    monkeypatch.setattr(pl, "pack_q4_1", _no_packing)
    monkeypatch.setattr(pl, "pack_q8_0", _no_packing)
    with caplog.at_level(logging.INFO, logger=loader.__name__):
        second = loader.load(engine)
    assert f"from {tmp_path / 'packed'}" in caplog.text
    layers = [
        (a, b)
        for a, b in zip(first.model.modules(), second.model.modules(), strict=True)
        if isinstance(a, PackedLinear)
    ]
    assert len(layers) == 4 * first.cfg.num_layers + 1
    for a, b in layers:
        assert isinstance(b, PackedLinear) and a.kind == b.kind
        assert torch.equal(a.qs, b.qs) and torch.equal(a.scales, b.scales)
