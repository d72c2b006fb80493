"""`trtllm-gateway config check FILE.yaml...` and `config show [serve flags]`.

check: validates each engine-args YAML against the TensorRT-LLM 1.2 schema, layered over the
built-in defaults and the default flags exactly as serve would, and prints the merged args.
show: builds Settings from the same flags serve takes and prints what the chosen engine gets:
the final merged LLM args for `--engine trtllm`, the built-in engine's settings otherwise.
Both print errors as one line on stderr and return 1 (2 for bad usage); never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trtllm_gateway.config.engine_args import (
    EngineArgsError,
    load_engine_args_file,
    merge_and_validate,
    resolve_trtllm_args,
    trtllm_layers,
)
from trtllm_gateway.config.settings import Settings

CHECK_USAGE = "usage: trtllm-gateway config check FILE.yaml [FILE.yaml ...]"


def main_check(argv: list[str]) -> int:
    """Validate each file; print `OK FILE` and its merged args, or `FILE: key: reason`."""
    if not argv or any(a in ("-h", "--help") for a in argv):
        _err(CHECK_USAGE)
        return 0 if argv else 2
    failed = 0
    for name in argv:
        try:
            merged = check_file(Path(name))
        except EngineArgsError as exc:
            _err(f"error: {exc}")
            failed += 1
            continue
        _out(f"# OK {name}\n")
        _out(dump_args(merged))
    return 1 if failed else 0


# The Settings fields the built-in engine reads (engine/builtin/config.py, its loader, KV cache
# and scheduler); `config show` prints them for --engine builtin.
BUILTIN_FIELDS = (
    "model", "served_model_name", "tokenizer", "load_format", "cache_dir", "mode", "device",
    "dtype", "max_model_len", "max_batch_size", "max_num_tokens", "block_size", "num_kv_blocks",
    "kv_cache_fraction", "enable_prefix_caching", "cuda_graphs", "stream_interval",
    "quantization", "packed_weights", "seed", "engine_process",
)  # fmt: skip


def main_show(argv: list[str]) -> int:
    """Print, as YAML, what `serve <argv>` would hand its engine: the final LLM args for
    --engine trtllm, the built-in (or fake) engine's settings otherwise."""
    try:
        settings = Settings(_cli_parse_args=argv, _cli_exit_on_error=False)
    except (ValidationError, SystemExit, ValueError) as exc:
        _err(f"error: {_first_line(exc)}")
        return 2
    if settings.engine != "trtllm":
        shown = settings.model_dump(mode="json", include=set(BUILTIN_FIELDS))
        _out(f"# --engine {settings.engine}\n")
        _out(dump_args(shown))
        return 0
    try:
        merged = resolve_trtllm_args(settings)
    except EngineArgsError as exc:
        _err(f"error: {exc}")
        return 1
    _out(dump_args(merged))
    return 0


def check_file(path: Path) -> dict[str, Any]:
    """The file layered over defaults and default flags; EngineArgsError if anything is wrong."""
    base = trtllm_layers(Settings(engine="trtllm"))
    return merge_and_validate([*base, (str(path), load_engine_args_file(path))])


def dump_args(args: dict[str, Any]) -> str:
    return yaml.safe_dump(args, sort_keys=True, default_flow_style=False)


def _out(text: str) -> None:
    sys.stdout.write(text)


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())
