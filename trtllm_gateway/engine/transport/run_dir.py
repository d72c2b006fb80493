"""The run directory (<temp dir>/gateway-core-*): a gateway's ipc:// sockets and, with several API
servers, prometheus_client's multiprocess files, the admission counts and the responses store.

The gateway removes it on the way out (supervisor.py, client.py), and an orphaned core does when
the gateway was killed (loop.py). A process group killed all at once with SIGKILL leaves it
behind, with nobody to remove it: each one made here records its owner's pid, and making one first
removes every other whose owner is gone. One without an owner file (being made, or made by an
older version) is kept, as is one whose owner pid is alive or belongs to another user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "gateway-core-"
OWNER = "owner.pid"


def make() -> str:
    """A new run directory owned by this process, after removing the stale ones."""
    sweep()
    folder = tempfile.mkdtemp(prefix=PREFIX)
    Path(folder, OWNER).write_text(str(os.getpid()))
    return folder


def sweep(root: str | None = None) -> list[str]:
    """Remove the run directories under root (the temp dir) whose owner process is gone."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(root or tempfile.gettempdir()) as entries:
        for entry in entries:
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                pid = int(Path(entry.path, OWNER).read_text())
            except (OSError, ValueError):
                continue
            if pid > 0 and not _alive(pid):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    if removed:
        logger.info("removed %d run directories left by killed gateways", len(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
