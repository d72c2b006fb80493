"""The OpenMP waiting policy of a process that runs the built-in engine, given as torch loads.

libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, in its constructor, and torch loads it on
`import torch`. This package's `__init__` imports torch through load_torch(), which puts
DEFAULTS (each unless the environment already names it) into the environment for that import
only and then takes them out again: the process that runs the engine (the core process, or the
server with --no-engine-process) waits as DEFAULTS say, and neither the rest of the gateway nor
anything a process starts afterwards inherits them (issue 36: the package once set
OMP_WAIT_POLICY=PASSIVE in os.environ on import, and bench.run's llama.cpp server, started from a
process that had imported it, ran about 3x slower for it).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

logger = logging.getLogger(__name__)

DEFAULTS: Mapping[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}


@contextmanager
def applied(defaults: Mapping[str, str] = DEFAULTS) -> Iterator[dict[str, str]]:
    """os.environ with `defaults` for the names it lacks, restored on exit; yields what it set."""
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield added
    finally:
        for k in added:
            os.environ.pop(k, None)


def load_torch() -> None:
    """Import torch with DEFAULTS in the environment (a no-op once torch is loaded: libgomp has
    read its variables by then, and the policy it got stays for the process)."""
    if "torch" in sys.modules:
        return
    with applied() as added:
        import torch  # noqa: F401  (loads libgomp, which reads the variables now)
    if added:
        logger.debug("OpenMP: %s for this process", added)
