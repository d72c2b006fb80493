"""Fuzzing against the real server. First schemathesis against the live /openapi.json: positive
examples only, a bounded number per operation, small max_tokens; no 5xx, and every response
matches what the schema documents (status-code checks are off: 400/404/503 are ours to give).
Then hostile inputs (hypothesis strategies) beside ordinary requests (issue 15).

Driven through hypothesis directly rather than schemathesis' pytest plugin, which does not load
under this pytest.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

from tests.e2e.ops_client import INTERNAL_AUTH, MODEL
from tests.e2e.server import Server

MAX_EXAMPLES = 20
PATHS = r"^/(v1/.*|health|version)$"
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]


def _bounded(body: Any) -> None:
    """Keep generations tiny and on the served model so the run stays fast."""
    if not isinstance(body, dict):
        return
    body["model"] = MODEL
    body["stream"] = False  # the schema documents JSON bodies, not event streams
    body["n"] = 1
    body["max_tokens"] = max(1, min(body.get("max_tokens") or 4, 4))  # chat, completions, messages
    body["max_output_tokens"] = 4  # /v1/responses: unset, a reply may run to the context's end
    body.pop("max_completion_tokens", None)


def test_openapi_fuzz(server: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    schema.config.generation.update(allow_x00=False)
    operations = [r.ok() for r in schema.include(path_regex=PATHS).get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"} <= paths
    t0 = time.monotonic()
    for operation in operations:

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(GenerationMode.POSITIVE))
        def fuzz(case: Any) -> None:
            _bounded(case.body)
            case.call_and_validate(checks=CHECKS, timeout=60)

        try:
            fuzz()
        except Exception as exc:
            pytest.fail(f"{operation.method.upper()} {operation.path}: {exc}\n{server.log()}")
    assert time.monotonic() - t0 < 240


# --- hostile inputs beside ordinary requests (issue 15) ---------------------------------------
#
# The schema-driven run above sends what the schema allows; this one sends what an attacker
# would: ids outside the vocabulary, huge and negative ints, NaN/Infinity, lone surrogates, deep
# nesting, reserved template kwargs, every sampling field at its extremes, a 10 MB body. Three
# greedy "victim" requests loop beside it; each must keep its output alone. Afterwards the engine
# is idle with KV usage 0. The counts go to hostile-counts.json in the log directory (recorded in
# docs/operations.md).

HOSTILE_EXAMPLES = 240
SENDERS = 4  # hostile inputs in flight at once, beside the victims
HANG_S = 60.0
VOCAB = 49152  # SmolLM2
INT_EXTREMES = [-(2**70), -(2**63), -100000, -1, 0, 1, 2, 2**31 - 1, 2**31, 2**63, 2**70, VOCAB]
FLOAT_EXTREMES = [math.nan, math.inf, -math.inf, -1e308, -2.5, -0.0, 0.0, 5e-324, 0.5, 2.5, 1e308]
INTS = st.sampled_from([*INT_EXTREMES, VOCAB - 1])
FLOATS = st.sampled_from([*FLOAT_EXTREMES, 1.0, 2.0])
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "\ud800", "a\udfffb", "\udc00\ud800", "\x00", "\u202e", "😀" * 40]),
)
IDS = st.lists(st.one_of(INTS, st.integers(0, VOCAB - 1)), max_size=4)
JSONISH = st.recursive(
    st.none() | st.booleans() | INTS | FLOATS | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
RESERVED = ["tokenize", "return_dict", "conversation", "messages", "chat_template", "tools"]
SAMPLING = {
    **dict.fromkeys(("max_tokens", "n", "best_of", "top_k", "min_tokens", "seed"), INTS),
    **dict.fromkeys(("temperature", "top_p", "min_p", "repetition_penalty"), FLOATS),
    **dict.fromkeys(("presence_penalty", "frequency_penalty"), FLOATS),
    "stop_token_ids": IDS,
    "allowed_token_ids": IDS,
    "logit_bias": st.dictionaries(st.one_of(INTS.map(str), TEXT), FLOATS, max_size=3),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=3)),
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
    "unknown_field": JSONISH,
}
CHAT_FIELDS = {
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"])},
            optional={"content": st.one_of(TEXT, JSONISH)},
        ),
        max_size=3,
    ),
    "logprobs": st.booleans(),
    "top_logprobs": INTS,
    "max_completion_tokens": INTS,
    "chat_template_kwargs": st.dictionaries(st.sampled_from([*RESERVED, "x"]), JSONISH, max_size=2),
}
CMPL_FIELDS = {
    "prompt": st.one_of(TEXT, IDS, st.lists(IDS, max_size=3), JSONISH),
    "logprobs": INTS,
    "echo": st.booleans(),
}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# What a sibling sends whole to /internal/v1/prefill (SamplingParams as JSON), at its extremes.
SIBLING_FIELDS = {
    **dict.fromkeys(("max_tokens", "top_k", "min_tokens", "seed", "logprobs"), INTS),
    **dict.fromkeys(("temperature", "top_p", "min_p", "repetition_penalty"), FLOATS),
    "prompt_logprobs": INTS,
    "stop_token_ids": IDS,
    "allowed_token_ids": IDS,
    "logit_bias": st.lists(st.tuples(INTS, FLOATS), max_size=2),
    "guided": st.fixed_dictionaries({"kind": st.sampled_from(["json", "regex", "xx"])}),
    "ignore_eos": JSONISH,
}


@st.composite
def hostile_sibling(draw: st.DrawFn) -> tuple[str, str]:
    names = draw(st.lists(st.sampled_from(sorted(SIBLING_FIELDS)), min_size=1, max_size=2))
    sampling = {"max_tokens": 4, **{n: draw(SIBLING_FIELDS[n]) for n in names}}
    ids = draw(st.one_of(st.just([1, 2, 3]), IDS))
    body = {"request_id": f"fuzz-{draw(st.uuids()).hex}", "prompt_token_ids": ids}
    return "/internal/v1/prefill", json.dumps({**body, "sampling": sampling})


@st.composite
def hostile(draw: st.DrawFn) -> tuple[str, str]:
    """(path, raw JSON text): Python's json writes NaN/Infinity and escapes lone surrogates."""
    if draw(st.integers(0, 5)) == 0:
        return draw(hostile_sibling())
    chat = draw(st.booleans())
    fields = {**SAMPLING, **(CHAT_FIELDS if chat else CMPL_FIELDS)}
    # One to three hostile fields on an ordinary body, so that each reaches the code behind
    # schema validation instead of all failing at the first bad field.
    names = draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True))
    body: dict[str, Any] = {name: draw(fields[name]) for name in names}
    if chat:
        body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    else:
        body.setdefault("prompt", "Hi")
    if not {"max_tokens", "max_completion_tokens"} & set(body):
        body["max_tokens"] = 4  # keep generations short; the hostile values come from INTS
    path = "/v1/chat/completions" if chat else "/v1/completions"
    text = json.dumps(body)
    depth = draw(st.sampled_from([0] * 8 + [65, 129, 600, 100_000]))
    if depth:
        text = text[:-1] + f', "deep": {_nested(depth)}}}'
    return path, text


@dataclass
class Tally:
    tried: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)  # 5xx other than load shedding
    hangs: list[str] = field(default_factory=list)
    victim_runs: int = 0
    victims_affected: list[str] = field(default_factory=list)
    victim_retries: int = 0  # 503 queue_full beside an n=128 request: shed, retried as SDKs do

    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # SENDERS threads

    def send(self, client: httpx.Client, path: str, text: str) -> None:
        headers = {"content-type": "application/json", **INTERNAL_AUTH}
        try:
            r = client.post(path, content=text.encode(), headers=headers, timeout=HANG_S)
        except httpx.TimeoutException:
            with self.lock:
                self.tried += 1
                self.hangs.append(text[:300])
            return
        if path == "/internal/v1/prefill" and r.status_code == 200:
            # A prefill holds its KV for the decode sibling until pulled (or a timeout): free it.
            held = r.json()["disaggregated_params"]["ctx_request_id"]
            client.delete(f"/internal/v1/kv/{held}", headers=INTERNAL_AUTH, timeout=HANG_S)
        shed = r.status_code == 503 and '"queue_full"' in r.text
        with self.lock:
            self.tried += 1
            self.statuses[r.status_code] += 1
            if r.status_code >= 500 and not shed:
                self.server_errors.append(f"{r.status_code} {r.text[:200]} <- {text[:300]}")


VICTIMS = ["Name three colors.", "What is 2+2?", "Say hello in French."]


def _victim(client: httpx.Client, tally: Tally, prompt: str) -> str | None:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 0}
    for _ in range(50):
        r = client.post("/v1/chat/completions", json=body, timeout=HANG_S)
        if r.status_code == 503 and "queue_full" in r.text:
            tally.victim_retries += 1
            time.sleep(0.2)
            continue
        return str(r.json()["choices"][0]["message"]["content"]) if r.status_code == 200 else None
    return None


def _victims_loop(url: str, tally: Tally, baseline: list[str], stop: threading.Event) -> None:
    with httpx.Client(base_url=url) as client:
        while not stop.is_set():
            for prompt, expected in zip(VICTIMS, baseline, strict=True):
                tally.victim_runs += 1
                try:
                    got = _victim(client, tally, prompt)
                except httpx.HTTPError as exc:
                    got = repr(exc)
                if got != expected:
                    tally.victims_affected.append(f"{prompt!r}: {got!r} != {expected!r}")


def _extremes() -> list[tuple[str, str]]:
    """Every numeric sampling field at each extreme, one field at a time, on an ordinary body
    (chat, completions, and the SamplingParams a sibling sends to /internal/v1/prefill)."""
    out = []
    for path, base in (
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        ),
    ):
        numeric = [f for f, strategy in SAMPLING.items() if strategy in (INTS, FLOATS)]
        numeric += ["logprobs", "top_logprobs", "max_completion_tokens"]
        for name in numeric:
            values = FLOAT_EXTREMES if SAMPLING.get(name) is FLOATS else INT_EXTREMES
            out += [(path, json.dumps({**base, name: value})) for value in values]
    for name, strategy in SIBLING_FIELDS.items():
        if strategy in (INTS, FLOATS):
            values = FLOAT_EXTREMES if strategy is FLOATS else INT_EXTREMES
            for value in values:
                sampling = {"max_tokens": 4, name: value}
                body = {"request_id": f"x-{name}-{value}", "prompt_token_ids": [1, 2, 3]}
                out.append(("/internal/v1/prefill", json.dumps({**body, "sampling": sampling})))
    return out


def test_hostile_inputs_beside_ordinary_requests(server: Server, log_dir: Path) -> None:
    tally = Tally()
    with httpx.Client(base_url=server.url) as client:
        baseline = [_victim(client, tally, p) or "" for p in VICTIMS]
    stop = threading.Event()
    victims = threading.Thread(target=_victims_loop, args=(server.url, tally, baseline, stop))
    victims.start()
    explicit = [
        *_extremes(),
        *[
            ("/v1/completions", json.dumps({"prompt": "a " * 5_000_000, "max_tokens": 1})),  # 10 MB
            ("/v1/completions", json.dumps({"prompt": "Hi", "n": 128, "max_tokens": 4})),
            ("/v1/completions", json.dumps({"prompt": ["a"] * 200_000, "max_tokens": 1})),
            ("/v1/completions", json.dumps({"prompt": "Hi", "n": 128, "max_tokens": 10**6})),
            ("/v1/chat/completions", json.dumps({"messages": [], "stop_token_ids": [-100000]})),
        ],
    ]
    # HOSTILE_EXAMPLES generated inputs are drawn first (no draw depends on an answer), then
    # every input, explicit and generated, goes out SENDERS at a time beside the victims.
    generated: list[tuple[str, str]] = []

    @settings(
        max_examples=HOSTILE_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=hostile())
    def draw(case: tuple[str, str]) -> None:
        generated.append(case)

    draw()
    assert len(generated) == HOSTILE_EXAMPLES
    try:
        _send_all(server.url, tally, [*explicit, *generated])
    finally:
        stop.set()
        victims.join(timeout=2 * HANG_S)
    idle = _wait_idle(server)
    counts = {
        "inputs_tried": tally.tried,
        "statuses": dict(sorted(tally.statuses.items())),
        "5xx": len(tally.server_errors),
        "hangs": len(tally.hangs),
        "victim_requests": tally.victim_runs,
        "victims_affected": len(tally.victims_affected),
        "victim_503_retries": tally.victim_retries,
        "kv_usage_after": idle,
    }
    (log_dir / "hostile-counts.json").write_text(json.dumps(counts, indent=1))
    print("hostile fuzz:", json.dumps(counts))  # the numbers docs/operations.md quotes
    assert not tally.server_errors, "\n".join(tally.server_errors[:5]) + server.log()
    assert not tally.hangs, tally.hangs[:3]
    assert not tally.victims_affected, tally.victims_affected[:5]
    assert tally.victim_runs >= len(VICTIMS)
    assert idle == 0, server.log()


def _send_all(url: str, tally: Tally, cases: list[tuple[str, str]]) -> None:
    """Send every case, SENDERS at once: each sender its own connection and its share in order.
    Sibling prefills that reuse a request id (drawn uuids repeat) share a sender, so each is
    sent and its KV freed before the next, as when one sender sent everything."""
    shares: list[list[tuple[str, str]]] = [[] for _ in range(SENDERS)]
    sender_of: dict[str, int] = {}
    for i, (path, text) in enumerate(cases):
        key = str(i)
        if path == "/internal/v1/prefill":
            # a hostile body may be no JSON object at all: then it has no id to share
            with contextlib.suppress(ValueError, AttributeError, RecursionError):
                key = str(json.loads(text).get("request_id", key))
        shares[sender_of.setdefault(key, i % SENDERS)].append((path, text))

    def sender(share: list[tuple[str, str]]) -> None:
        with httpx.Client(base_url=url) as client:
            for path, text in share:
                tally.send(client, path, text)

    with ThreadPoolExecutor(SENDERS) as pool:
        for done in [pool.submit(sender, share) for share in shares]:
            done.result()  # a sender's exception (a dropped connection) fails the test
    assert tally.tried == len(cases)


def _wait_idle(server: Server, timeout_s: float = 20.0) -> float:
    """KV usage once nothing runs or waits (or the last reading after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = server.metric("trtllm_gateway:num_requests_running")
        waiting = server.metric("trtllm_gateway:num_requests_waiting")
        usage = server.metric("trtllm_gateway:kv_cache_usage_perc")
        if (running == waiting == usage == 0) or time.monotonic() > deadline:
            return usage
        time.sleep(0.2)
