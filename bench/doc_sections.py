"""The tool-written sections of docs/benchmarks.md, and the history a replaced one moves to.

docs/benchmarks.md holds current figures only (issue 37); bench.run writes two of its sections,
each between `<!-- NAME:begin -->` and `<!-- NAME:end -->` (NAME: cpu, gpu). Replacing one moves
the figures it held to the top of docs/benchmarks_history.md (the file beside the page written),
dated by the first date they carry, so that nothing measured is lost:

    benchmarks.md           cpu block: new figures        benchmarks_history.md
                            (the old ones) ─────────────▶  <!-- history:newest -->
                                                           ## 2026-11-27: the old cpu block ...
                                                           (older entries)
"""

from __future__ import annotations

import re
from pathlib import Path

HISTORY_NAME = "benchmarks_history.md"
HISTORY_MARK = "<!-- history:newest -->"
_DATE = re.compile(r"(?<!\d)(20\d\d-\d\d-\d\d)(?!\d)")


def replace_section(doc: str, name: str, body: str) -> tuple[str, str | None]:
    """`doc` with section `name` holding `body` (appended if absent), and the body it held
    before (None: it had no such section)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in doc:
        return doc + f"\n{begin}\n{body}{end}\n", None
    head, rest = doc.split(begin, 1)
    old, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}", old.strip("\n")


def history_path(doc: Path) -> Path:
    """Where the history of the page `doc` lives: beside it."""
    return doc.with_name(HISTORY_NAME)


def archive(history: str, name: str, old: str, today: str) -> str:
    """`history` with `old`, the replaced body of section `name`, as its newest entry; unchanged
    when `old` is empty or already in it word for word (a block first copied by hand)."""
    old = old.strip()
    if not old or old in history:
        return history
    found = _DATE.search(old)
    date = found.group(1) if found else "undated"
    entry = (
        f"## {date}: the `{name}` block of benchmarks.md\n\n"
        f"*Replaced by `bench.run` on {today}.*\n\n{old}\n\n"
    )
    if HISTORY_MARK not in history:
        history = (history.rstrip() or "# Benchmarks: history") + f"\n\n{HISTORY_MARK}\n"
    head, tail = history.split(HISTORY_MARK, 1)
    return f"{head}{HISTORY_MARK}\n\n{entry}{tail.lstrip(chr(10))}"
