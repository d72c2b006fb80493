"""run_dir: a gateway's run directory records its owner, and making one removes those whose owner
is gone (a process group killed all at once with SIGKILL leaves its directory behind)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from trtllm_gateway.engine.transport import run_dir


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _run_dir(root: Path, name: str, owner: int | str | None) -> Path:
    folder = root / f"{run_dir.PREFIX}{name}"
    folder.mkdir()
    (folder / "in-0").write_text("a socket's place")
    if owner is not None:
        (folder / run_dir.OWNER).write_text(str(owner))
    return folder


def test_sweep_removes_only_directories_whose_owner_is_gone(tmp_path: Path) -> None:
    dead = _run_dir(tmp_path, "dead", _dead_pid())
    alive = _run_dir(tmp_path, "alive", os.getpid())
    init = _run_dir(tmp_path, "another-users", 1)  # pid 1: alive (and not ours to signal)
    unowned = _run_dir(tmp_path, "unowned", None)  # being made, or an older version's
    garbled = _run_dir(tmp_path, "garbled", "not a pid")
    other = tmp_path / "something-else"
    other.mkdir()
    (tmp_path / f"{run_dir.PREFIX}a-file").write_text(str(_dead_pid()))
    assert run_dir.sweep(str(tmp_path)) == [str(dead)]
    assert not dead.exists()
    for kept in (alive, init, unowned, garbled, other, tmp_path / f"{run_dir.PREFIX}a-file"):
        assert kept.exists()


def test_make_records_its_owner_and_sweeps_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = _run_dir(tmp_path, "stale", _dead_pid())
    folder = Path(run_dir.make())
    assert folder.parent == tmp_path and folder.name.startswith(run_dir.PREFIX)
    assert (folder / run_dir.OWNER).read_text() == str(os.getpid())
    assert not stale.exists()
    assert run_dir.sweep(str(tmp_path)) == []  # this process's own stays
