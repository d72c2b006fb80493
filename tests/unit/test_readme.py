"""The README is the user-facing spec: its flags table matches Settings, its commands exist."""

from __future__ import annotations

from pathlib import Path

from trtllm_gateway.config.flags_doc import README, render

ROOT = Path(__file__).resolve().parents[2]


def test_flags_table_is_current() -> None:
    text = README.read_text()
    assert render(text) == text, "run: python -m trtllm_gateway.config.flags_doc --write"


def test_readme_names_the_two_commands_and_make_targets_exist() -> None:
    text = README.read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("serve", "test", "bench", "soak", "lint", "typecheck"):
        assert f"make {target}" in text
        assert f"\n{target}:" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
