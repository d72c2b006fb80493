"""Every repository path that README.md and docs/ name exists, so a move or a rename cannot leave
the docs pointing at nothing (issue 16 item 7).

What counts as a path, and what is skipped:
- anything starting with one of our top-level folders (`trtllm_gateway/`, `tests/`, `bench/`,
  `docs/`, `deploy/`, `.ci/`), in prose, inline code or code blocks, up to a placeholder such as
  `<shape>` or `*`: it must exist from the repository root;
- the package's folders as they were before the move under `trtllm_gateway/` (`app/`, `engine/`,
  `routers/`, `multimodal/`, `config/`): none exists at the root any more, so each is an error;
- a bare source file name in backticks (`foo.py`) must be one of our files outside the TensorRT-LLM
  stand-in (which mirrors upstream names, so a bare `py_executor.py` would pass by accident);
- relative Markdown links must exist;
- URLs are skipped, and so are upstream citations, which are marked as `owner/repo:path`
  (`NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py`) with a repository named in UPSTREAM.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
UPSTREAM = {"NVIDIA/TensorRT-LLM", "ai-dynamo/dynamo"}

_ROOTS = r"trtllm_gateway|tests|bench|docs|deploy|\.ci|app|engine|routers|multimodal|config"
# Not after a word, a slash (URLs, deeper paths), a dot, `$`, `-` or `:` (upstream citations).
_PATH = re.compile(rf"(?<![\w/.$:-])(?:{_ROOTS})/[\w./-]*")
_BARE_SOURCE = re.compile(r"`([\w-]+\.(?:py|cpp|h|cu))`")
_UPSTREAM = re.compile(r"`([\w.-]+/[\w.-]+):[\w./-]+`")
_LINK = re.compile(r"\]\(([^)#\s]+)")


def _tracked_basenames() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return {Path(f).name for f in out.split() if not f.startswith("tests/standin/")}


def dangling(text: str, doc_dir: Path, basenames: set[str]) -> list[str]:
    """The references in one document that name nothing in the repository."""
    bad: list[str] = []
    for m in _PATH.finditer(text):
        path = m.group(0).rstrip(".")
        if not (ROOT / path).exists():
            bad.append(path)
    bad += [m.group(1) for m in _BARE_SOURCE.finditer(text) if m.group(1) not in basenames]
    bad += [m.group(0) for m in _UPSTREAM.finditer(text) if m.group(1) not in UPSTREAM]
    for m in _LINK.finditer(text):
        target = m.group(1)
        if "://" not in target and not (doc_dir / target).exists():
            bad.append(target)
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_docs_name_only_files_that_exist(doc: Path) -> None:
    assert dangling(doc.read_text(), doc.parent, _tracked_basenames()) == []


def test_the_check_catches_each_kind_of_dangling_reference() -> None:
    names = _tracked_basenames()
    text = (
        "See `engine/builtin/scheduler.py`, trtllm_gateway/engine/nope.py, `py_executor.py`,"
        " `someone/else:x.py` and [the guide](nowhere.md)."
    )
    assert dangling(text, ROOT / "docs", names) == [
        "engine/builtin/scheduler.py",
        "trtllm_gateway/engine/nope.py",
        "py_executor.py",
        "`someone/else:x.py`",
        "nowhere.md",
    ]
    fine = (
        "`trtllm_gateway/engine/builtin/scheduler.py`, `sampler.py`,"
        " `NVIDIA/TensorRT-LLM:tensorrt_llm/llmapi/llm_args.py`,"
        " https://github.com/NVIDIA/TensorRT-LLM/tree/main/tests/unittest,"
        " `trtllm_gateway/config/models/<shape>.json` and [kv events](kv_events.md)."
    )
    assert dangling(fine, ROOT / "docs", names) == []
