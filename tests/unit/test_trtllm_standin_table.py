"""docs/trtllm.md's stand-in table stays true to the tree: every row cites an upstream file and
function and the release it was read from, its stand-in line exists, its tests exist (issue 35
item 6)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "trtllm.md"


def _rows() -> list[list[str]]:
    text = DOC.read_text()
    table = text.split("<!-- stand-in table: start -->")[1].split("<!-- stand-in table: end -->")[0]
    lines = [line for line in table.strip().splitlines() if line.startswith("| ")][2:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
    return names


def test_every_row_cites_source_release_standin_line_and_tests() -> None:
    rows = _rows()
    assert len(rows) >= 43
    defined = _defined_tests()
    for number, (index, _behaviour, upstream, release, standin, tests) in enumerate(rows, 1):
        where = f"row {number}"
        assert index == str(number), where
        assert re.search(r"\.(py|cpp) \(`", upstream), f"{where}: no file and function: {upstream}"
        assert release.startswith("1.2 window"), f"{where}: no release: {release}"
        path, line = re.fullmatch(r"`(tests/standin/\S+):(\d+)`", standin).groups()  # type: ignore[union-attr]
        assert int(line) <= len((ROOT / path).read_text().splitlines()), where
        named = re.findall(r"`(test_\w+)`", tests)
        assert named, where
        missing = [name for name in named if name not in defined]
        assert not missing, f"{where}: no such test {missing}"
