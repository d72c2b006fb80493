"""docs/benchmarks.md keeps current figures only; a block bench.run replaces moves to the top of
the history beside it (bench/doc_sections.py, issue 37), and the tracked pages change only with
--doc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.doc_sections import HISTORY_MARK, archive, replace_section

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
HISTORY = ROOT / "docs" / "benchmarks_history.md"


def test_the_tracked_pages_have_each_marker_once() -> None:
    """A marker named twice (in prose, say) would make bench.run cut the page at the wrong one."""
    doc = DOC.read_text()
    for name in ("cpu", "gpu"):
        for edge in ("begin", "end"):
            assert doc.count(f"<!-- {name}:{edge} -->") == 1, (name, edge)
    assert HISTORY.read_text().count(HISTORY_MARK) == 1


def test_a_replaced_block_goes_to_the_top_of_the_history_dated() -> None:
    block = "Measured 2026-11-20 08:00 UTC: 12 tok/s"
    doc = f"# B\n\n<!-- cpu:begin -->\n{block}\n<!-- cpu:end -->\nend\n"
    new, old = replace_section(doc, "cpu", "Measured 2026-12-01: 20 tok/s\n")
    assert old == "Measured 2026-11-20 08:00 UTC: 12 tok/s"
    assert "20 tok/s" in new and "12 tok/s" not in new and new.endswith("end\n")
    history = f"# H\n\nintro\n\n{HISTORY_MARK}\n\n## 2026-11-19: older\n\nold text\n"
    out = archive(history, "cpu", old, "2026-12-01 09:00 UTC")
    assert out.index("intro") < out.index(HISTORY_MARK) < out.index("12 tok/s") < out.index("older")
    assert "## 2026-11-20: the `cpu` block" in out and "2026-12-01 09:00 UTC" in out
    # Already there word for word (a block first moved by hand), or empty: nothing added.
    assert archive(out, "cpu", old, "later") == out
    assert archive(history, "cpu", "\n", "later") == history
    # No history yet: one is started.
    assert archive("", "gpu", "Run: 2026-11-22", "now").count(HISTORY_MARK) == 1


def test_a_block_added_where_none_was_archives_nothing() -> None:
    new, old = replace_section("# B\n", "gpu", "x\n")
    assert old is None and new.endswith("<!-- gpu:begin -->\nx\n<!-- gpu:end -->\n")


def _run(cwd: Path, summary: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "bench.run", "--skip-cpu", "--gpu-summary", str(summary)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=60,
        check=True,
    )


def test_bench_run_moves_the_replaced_summary_to_the_results_history(tmp_path: Path) -> None:
    """Two `make bench`-style runs in a copy of the repository's docs: the second's summary is
    current, the first's is the history's newest entry; docs/ is untouched."""
    (tmp_path / "docs").mkdir()
    for page in (DOC, HISTORY):
        (tmp_path / "docs" / page.name).write_bytes(page.read_bytes())
    first, second = tmp_path / "first.md", tmp_path / "second.md"
    first.write_text("Run: 2026-12-01T10:00:00Z | FIRST SUMMARY\n")
    second.write_text("Run: 2026-12-02T10:00:00Z | SECOND SUMMARY\n")
    _run(tmp_path, first)
    _run(tmp_path, second)
    results = tmp_path / "bench-results"
    current = (results / "benchmarks.md").read_text()
    history = (results / "benchmarks_history.md").read_text()
    assert "SECOND SUMMARY" in current and "FIRST SUMMARY" not in current
    top = history.split(HISTORY_MARK, 1)[1]
    assert top.index("FIRST SUMMARY") < top.index("## 2026-11-27")  # newest first
    assert "## 2026-12-01: the `gpu` block" in top
    # The 2026-11-22 suite table the page held first is in the history already: not twice.
    assert history.count("6,647 output tok/s") == HISTORY.read_text().count("6,647 output tok/s")
    for page in (DOC, HISTORY):
        assert (tmp_path / "docs" / page.name).read_bytes() == page.read_bytes()
