"""Stand-in `tensorrt_llm.logger`: the process-wide Logger whose level `set_level` changes."""

from __future__ import annotations

import logging

_LEVELS = {
    "internal_error": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "verbose": logging.DEBUG,
    "debug": logging.DEBUG,
    "trace": logging.DEBUG,
}


class Logger:
    def __init__(self) -> None:
        self.level = "warning"  # TLLM_LOG_LEVEL's default in 1.2

    def set_level(self, level: str) -> None:
        if level not in _LEVELS:
            raise KeyError(level)  # the real one indexes its severity map the same way
        self.level = level
        logging.getLogger("tensorrt_llm").setLevel(_LEVELS[level])


logger = Logger()
