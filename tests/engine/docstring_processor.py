"""The Ban logits processor of engine/logits/processor.py's docstring, exactly as written there.

Loaded by path (`--logits-processor tests.engine.docstring_processor:Ban`) so that the tests run
the example users copy (issue 40: its first version, `int(args["ban"])`, ended the engine core on
`{"ban": [1, 2]}`).
"""

from __future__ import annotations

import textwrap
from typing import Any

from trtllm_gateway.engine.logits import processor
from trtllm_gateway.engine.logits.processor import LogitsProcessor


def docstring_example() -> type[LogitsProcessor[int]]:
    doc = processor.__doc__ or ""
    start = doc.index("    class Ban(")
    end = doc.index("\n\n`logits`", start)
    namespace: dict[str, Any] = {"LogitsProcessor": LogitsProcessor}
    exec(textwrap.dedent(doc[start:end]), namespace)
    cls: type[LogitsProcessor[int]] = namespace["Ban"]
    return cls


Ban = docstring_example()
