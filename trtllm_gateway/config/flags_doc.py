"""Render the serve flags (from Settings) as the README's markdown table; `--write` updates it."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic_core import PydanticUndefined

from trtllm_gateway.config.settings import Settings

START, END = "<!-- flags-table:start -->", "<!-- flags-table:end -->"
README = Path(__file__).resolve().parents[2] / "README.md"


def _default(value: object) -> str:
    if value is PydanticUndefined or value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`" if value not in ([], "") else ""


def table() -> str:
    rows = ["| Flag | Default | Meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{flag}` | {_default(default)} | {desc} |")
    return "\n".join(rows)


def render(readme: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> int:
    text = README.read_text()
    new = render(text)
    if "--write" in sys.argv:
        README.write_text(new)
        return 0
    if new != text:
        sys.stderr.write(
            "README flags table is stale: python -m trtllm_gateway.config.flags_doc --write\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
