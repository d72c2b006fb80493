"""`trtllm-gateway config check FILE.yaml...` and `config show [serve flags]`.

check: validates each engine-args YAML against the TensorRT-LLM 1.2 schema, layered over the
built-in defaults and the default flags exactly as serve would, and prints the merged args.
show: builds the configs from the same flags serve takes and prints what the chosen engine gets:
the final merged LLM args for `--engine trtllm`, the whole EngineConfig otherwise.
Both print errors as one line on stderr and return 1 (2 for bad usage); never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.config.engine_args import (
    EngineArgsError,
    load_engine_args_file,
    merge_and_validate,
    resolve_trtllm_args,
    trtllm_layers,
)
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.config.trtllm import TrtllmConfig

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


# What `config show` prints for --engine builtin: the whole EngineConfig, the part
# the built-in engine core receives.
BUILTIN_FIELDS = tuple(EngineConfig.model_fields)


def main_show(argv: list[str]) -> int:
    """Print, as YAML, what `serve <argv>` would hand its engine: the final LLM args for
    --engine trtllm, the built-in engine's settings otherwise."""
    try:
        config = Settings(_cli_parse_args=argv, _cli_exit_on_error=False).parts()
    except (ValidationError, SystemExit, ValueError) as exc:
        _err(f"error: {_first_line(exc)}")
        return 2
    engine = config.engine
    if engine.engine != "trtllm":
        _out(f"# --engine {engine.engine}\n")
        _out(dump_args(engine.model_dump(mode="json")))
        return 0
    try:
        merged = resolve_trtllm_args(engine, config.trtllm)
    except EngineArgsError as exc:
        _err(f"error: {exc}")
        return 1
    _out(dump_args(merged))
    return 0


def check_file(path: Path) -> dict[str, Any]:
    """The file layered over defaults and default flags; EngineArgsError if anything is wrong."""
    base = trtllm_layers(EngineConfig(engine="trtllm"), TrtllmConfig())
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
