"""Render the serve flags as docs/flags.md's tables, one per config part; `--write` updates it.

Each table is the part that owns its flags (config/server.py, serving.py, ...), so the page
says which subsystem reads a flag."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from trtllm_gateway.config.settings import PARTS

START, END = "<!-- flags-table:start -->", "<!-- flags-table:end -->"
ROOT = Path(__file__).resolve().parents[2]
FLAGS_DOC = ROOT / "docs" / "flags.md"


def _default(value: object) -> str:
    if value is PydanticUndefined or value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`" if value not in ([], "") else ""


def part_table(part: type[BaseModel]) -> str:
    rows = ["| Flag | Default | Meaning |", "| --- | --- | --- |"]
    for name, field in part.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{flag}` | {_default(default)} | {desc} |")
    return "\n".join(rows)


def table() -> str:
    sections = []
    for part in PARTS:
        # Each part's module docstring opens with "Name: what it holds"; its first line heads it.
        module = sys.modules[part.__module__]
        summary = (module.__doc__ or part.__name__).strip().splitlines()[0]
        path = module.__name__.replace(".", "/") + ".py"
        name, _, holds = summary.partition(": ")
        sections.append(f"**{name}** (`{path}`): {holds}\n\n{part_table(part)}")
    return "\n\n".join(sections)


def render(page: str) -> str:
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    text = FLAGS_DOC.read_text()
    new = render(text)
    if "--write" in sys.argv:
        FLAGS_DOC.write_text(new)
        return 0
    if new != text:
        sys.stderr.write(
            "docs/flags.md is stale: python -m trtllm_gateway.config.flags_doc --write\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
