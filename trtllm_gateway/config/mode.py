"""Mode: an instance's role in disaggregated serving (--mode), one vocabulary for the flags,
the engine boundary (EngineInfo.mode) and the sibling protocol.

Free of pydantic, so the engine protocol (which knows no pydantic) can name it.
"""

from __future__ import annotations

from typing import Literal

Mode = Literal["aggregated", "prefill", "decode", "encode"]
