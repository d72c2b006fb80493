"""One name, one thing (STYLE.md, "Names and sizes"; issue 37 item 3), read from the package's AST.

A class, public function, type alias or module basename defined twice in trtllm_gateway/ is a
reader's trap (two Admission classes, two check_token_ids, Mode twice, two placement.py), unless
it is listed below with why it stays; and the package ships no test double (FakeEngine lives in
tests/fake_engine.py).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import trtllm_gateway

PACKAGE = Path(trtllm_gateway.__file__).parent

# Wire models named as each API names them: chat's and Responses' own shapes (routers/openai/
# schemas.py, routers/openai/responses/schemas.py), Anthropic's usage beside the engine's.
CLASSES = {"ContentPart", "FunctionCall", "NamedToolChoice", "Usage"}
# Same job at another layer or for another format, always called through their module:
# kv_wire.encode / sibling_wire.encode, each process entry point's main, the agent translators'
# to_chat / chat_messages / wire_param (one interface, two APIs), the TensorRT-LLM preflight the
# factory's calls, fp8's torch reference of the Triton kernel's quantize_rows.
FUNCTIONS = {
    "decode", "encode", "main", "load", "preflight", "quantize_rows",
    "to_chat", "chat_messages", "wire_param",
}  # fmt: skip
# One concept at each layer (config part / endpoint / engine adapter), or each endpoint's
# router, parse, render, translate and schemas.
MODULES = {
    "disagg.py", "encode.py", "engine.py", "errors.py", "images.py", "kv_events.py",
    "loader.py", "metrics.py", "parse.py", "render.py", "router.py", "sampling.py",
    "schemas.py", "server.py", "stats.py", "translate.py", "__init__.py",
}  # fmt: skip


def _definitions() -> dict[str, dict[str, list[str]]]:
    found: dict[str, dict[str, list[str]]] = {
        kind: defaultdict(list) for kind in ("class", "function", "alias", "module")
    }
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        found["module"][path.name].append(where)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found["class"][node.name].append(where)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if not node.name.startswith("_"):
                    found["function"][node.name].append(where)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:  # CamelCase module-level names: type aliases
                    if isinstance(t, ast.Name) and t.id[:1].isupper() and not t.id.isupper():
                        found["alias"][t.id].append(where)
    return found


def test_no_name_means_two_things() -> None:
    allowed = {"class": CLASSES, "function": FUNCTIONS, "alias": set(), "module": MODULES}
    twice = {
        kind: {name: where for name, where in names.items() if len(where) > 1}
        for kind, names in _definitions().items()
    }
    unexplained = {
        kind: {name: where for name, where in names.items() if name not in allowed[kind]}
        for kind, names in twice.items()
    }
    assert unexplained == {kind: {} for kind in twice}
    # The allow lists name only what is still defined twice.
    assert {kind: set(names) & allowed[kind] for kind, names in twice.items()} == allowed


def test_the_package_ships_no_test_double() -> None:
    fakes = [k for k in _definitions()["class"] if k.startswith(("Fake", "Mock", "Stub"))]
    assert fakes == []
