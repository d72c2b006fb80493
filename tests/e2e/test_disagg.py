"""Two real processes: a prefill instance and a decode instance doing remote prefill over HTTP."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.ops_client import INTERNAL_KEY
from tests.e2e.server import Server, free_port
from tests.otlp_receiver import OtlpReceiver

INTERNAL = ["--internal-api-key", INTERNAL_KEY]  # both sides of a pair share it

MODEL = "SmolLM2-135M-Instruct"
LONG_SYSTEM = (
    "You are a careful assistant. Answer briefly, in plain words, and check every fact twice. "
    "Never invent sources. Prefer short sentences. Use the metric system. "
) * 3
PROMPTS = ["What is the capital of France?", "Name three colors.", "What is 12 times 12?"]


def chat(prompt: str, **kw: object) -> dict[str, object]:
    # The prompt leads the system text so that prompts differ from their first block on, and the
    # decode instance's prefix cache does not turn a new prompt into a short local prefill.
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": f"Topic: {prompt}\n{LONG_SYSTEM}"},
            {"role": "user", "content": prompt},
        ],
        "temperature": 0,
        "max_tokens": 24,
        "logprobs": True,
        **kw,
    }


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    """Both instances send their traces here (a real OTLP/HTTP receiver, protobuf)."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


def _traced(otlp: OtlpReceiver, name: str) -> tuple[list[str], dict[str, str]]:
    # The SDK's batch delay (ms) down from 5 s, so spans arrive while the test waits.
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": name}
    return ["--otlp-traces-endpoint", otlp.url], env


@pytest.fixture(scope="module")
def prefill(log_dir: Path, otlp: OtlpReceiver) -> Iterator[Server]:
    tracing, env = _traced(otlp, "prefill-sibling")
    args = ["--mode", "prefill", "--num-kv-blocks", "512", *INTERNAL, *tracing]
    srv = Server(args=args, env=env).start(log_dir)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def decode(prefill: Server, log_dir: Path, otlp: OtlpReceiver) -> Iterator[Server]:
    tracing, env = _traced(otlp, "decode")
    args = ["--mode", "decode", "--prefill-url", prefill.url, "--num-kv-blocks", "512", *INTERNAL]
    srv = Server(args=[*args, "--max-local-prefill-tokens", "64", *tracing], env=env)
    srv.start(log_dir)
    yield srv
    srv.stop()


def _tokens_and_logprobs(body: dict) -> tuple[str, list[float]]:
    choice = body["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


def _stream_text(url: str, payload: dict) -> str:
    text = ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=payload, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for ch in json.loads(line[6:])["choices"]:
                    text += ch["delta"].get("content") or ""
    return text


def test_prefill_instance_refuses_client_generation(prefill: Server) -> None:
    r = httpx.post(f"{prefill.url}/v1/chat/completions", json=chat("hi"), timeout=30)
    assert r.status_code == 400
    assert "--mode prefill" in r.json()["error"]["message"]


def test_remote_prefill_matches_aggregated(server: Server, decode: Server) -> None:
    before = decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="remote"')
    for p in PROMPTS:
        agg = httpx.post(f"{server.url}/v1/chat/completions", json=chat(p), timeout=60).json()
        dis = httpx.post(f"{decode.url}/v1/chat/completions", json=chat(p), timeout=60).json()
        agg_text, agg_lp = _tokens_and_logprobs(agg)
        dis_text, dis_lp = _tokens_and_logprobs(dis)
        assert dis_text == agg_text
        assert len(dis_lp) == len(agg_lp)
        assert max(abs(a - b) for a, b in zip(agg_lp, dis_lp, strict=True)) < 1e-4
        # Asked again, the prompt is in the decode instance's prefix cache: prefilled locally.
        assert _stream_text(decode.url, chat(p, stream=True)) == agg_text
    after = decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="remote"')
    assert after - before == len(PROMPTS)
    assert decode.metric("trtllm_gateway:kv_transfer_bytes_total") > 0


def test_remote_prefill_takes_the_kv_from_shared_memory(decode: Server) -> None:
    """Both instances on this host, on CPUs: protocol v2 picks shm (the decode core copies the
    prefill core's staged region; tokens checked above)."""
    assert "KV moves by shm" in decode.log()


def test_remote_prefill_over_the_http_stream_matches_aggregated(
    server: Server, prefill: Server, log_dir: Path
) -> None:
    """--kv-transport http: the KV comes as protocol v2's stream (header, payload, digest)."""
    args = ["--mode", "decode", "--prefill-url", prefill.url, "--num-kv-blocks", "512", *INTERNAL]
    srv = Server(args=[*args, "--max-local-prefill-tokens", "64", "--kv-transport", "http"])
    srv.start(log_dir)
    try:
        for p in ("Why is the sky blue?", "Spell the word banana."):
            agg = httpx.post(f"{server.url}/v1/chat/completions", json=chat(p), timeout=60).json()
            dis = httpx.post(f"{srv.url}/v1/chat/completions", json=chat(p), timeout=60).json()
            agg_text, agg_lp = _tokens_and_logprobs(agg)
            dis_text, dis_lp = _tokens_and_logprobs(dis)
            assert dis_text == agg_text
            assert max(abs(a - b) for a, b in zip(agg_lp, dis_lp, strict=True)) < 1e-4
        assert srv.metric("trtllm_gateway:remote_prefill_total", 'outcome="remote"') == 2
        assert "KV moves by http" in srv.log()
    finally:
        srv.stop()


def test_trace_holds_the_siblings_prefill_as_a_child_span(
    decode: Server, otlp: OtlpReceiver
) -> None:
    """One request with a client traceparent: the decode instance's llm_request span continues
    the client's trace, and the prefill sibling's span is its child, both at the receiver."""
    trace_id, client_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    headers = {"traceparent": f"00-{trace_id}-{client_span}-01"}
    before = decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="remote"')
    payload = chat("Which ocean is the largest?")
    r = httpx.post(f"{decode.url}/v1/chat/completions", json=payload, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="remote"') == before + 1
    ours = otlp.wait_for(lambda s: s.trace_id == trace_id and s.name == "llm_request")
    theirs = otlp.wait_for(lambda s: s.trace_id == trace_id and s.name == "prefill")
    assert len(ours) == 1 and len(theirs) == 1, otlp.spans
    assert ours[0].parent_span_id == client_span
    assert theirs[0].parent_span_id == ours[0].span_id
    assert ours[0].resource["service.name"] == "decode"  # each process names itself
    assert theirs[0].resource["service.name"] == "prefill-sibling"
    usage = r.json()["usage"]
    a, b = ours[0].attributes, theirs[0].attributes
    assert a["gen_ai.usage.prompt_tokens"] == b["gen_ai.usage.prompt_tokens"]
    assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == usage["completion_tokens"]
    assert b["gen_ai.request.id"].startswith(a["gen_ai.request.id"])  # the engine request's id
    assert ours[0].start_ns <= theirs[0].start_ns <= theirs[0].end_ns <= ours[0].end_ns


def test_short_prompt_stays_local(decode: Server) -> None:
    before = decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="local_short"')
    short = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    r = httpx.post(f"{decode.url}/v1/chat/completions", json=short, timeout=60)
    assert r.status_code == 200
    after = decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="local_short"')
    assert after == before + 1


def _idle(srv: Server, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (
            srv.metric("trtllm_gateway:num_requests_running") == 0
            and srv.metric("trtllm_gateway:kv_cache_usage_perc") == 0
        ):
            return True
        time.sleep(0.1)
    return False


def test_disconnect_during_decode_frees_both(prefill: Server, decode: Server) -> None:
    payload = chat("Tell me a long story.", max_tokens=3000, ignore_eos=True, stream=True)
    with httpx.stream("POST", f"{decode.url}/v1/chat/completions", json=payload, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(10):
            next(lines)
    assert _idle(decode) and _idle(prefill)


def test_disconnect_during_remote_prefill_frees_both(prefill: Server, decode: Server) -> None:
    long_prompt = "Summarize: " + "the quick brown fox jumps over the lazy dog. " * 300
    payload = chat(long_prompt, max_tokens=2000, ignore_eos=True)
    with contextlib.suppress(httpx.ReadTimeout):
        httpx.post(f"{decode.url}/v1/chat/completions", json=payload, timeout=0.3)
    assert _idle(decode) and _idle(prefill)


def test_mismatched_sibling_is_refused(prefill: Server, log_dir: Path) -> None:
    args = ["--mode", "decode", "--prefill-url", prefill.url, "--block-size", "8", *INTERNAL]
    srv = Server(args=[*args, "--num-kv-blocks", "256"]).start(log_dir, wait=False)
    try:
        deadline = time.monotonic() + 120
        body = ""
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{srv.url}/health", timeout=2)
                body = r.text
                if "incompatible" in body:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert r.status_code == 503
        assert "incompatible" in body and "bs8" in body and "bs16" in body
    finally:
        srv.stop()


def test_dead_sibling_falls_back_or_503(log_dir: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    common = ["--mode", "decode", "--prefill-url", dead, "--max-local-prefill-tokens", "0"]
    lenient = Server(args=[*common, "--num-kv-blocks", "256"]).start(log_dir)
    strict = Server(args=[*common, "--num-kv-blocks", "256", "--require-remote-prefill"])
    strict.start(log_dir)
    try:
        r = httpx.post(f"{lenient.url}/v1/chat/completions", json=chat(PROMPTS[0]), timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        assert (
            lenient.metric("trtllm_gateway:remote_prefill_total", 'outcome="local_fallback"') == 1
        )
        r = httpx.post(f"{strict.url}/v1/chat/completions", json=chat(PROMPTS[0]), timeout=60)
        assert r.status_code == 503
        assert r.json()["error"]["message"]
    finally:
        lenient.stop()
        strict.stop()


def test_sibling_killed_mid_run_requests_complete(prefill: Server, decode: Server) -> None:
    """Runs last in this module: it kills the prefill instance while requests are in flight."""
    import concurrent.futures

    payloads = [
        chat(f"{i}: {p} Explain in detail.", max_tokens=40) for i, p in enumerate(PROMPTS * 2)
    ]
    with concurrent.futures.ThreadPoolExecutor(len(payloads)) as pool:
        futures = [
            pool.submit(httpx.post, f"{decode.url}/v1/chat/completions", json=p, timeout=120)
            for p in payloads
        ]
        time.sleep(0.5)
        # SIGTERM: the sibling drains what it admitted (bounded by --shutdown-timeout, 30 s;
        # 12 context phases on two loaded cores took ~8 s) and refuses the rest.
        prefill.stop(timeout=60)
        results = [f.result() for f in futures]
    assert [r.status_code for r in results] == [200] * len(payloads)
    assert all(r.json()["choices"][0]["message"]["content"] for r in results)
    # The drained sibling served all of those; a prompt past --max-local-prefill-tokens now
    # (not one the local prefix cache makes short) finds it gone and is prefilled here.
    long = f"{PROMPTS[1]} " + " ".join(f"item{i}" for i in range(60))
    r = httpx.post(f"{decode.url}/v1/chat/completions", json=chat(long), timeout=60)
    assert r.status_code == 200
    assert decode.metric("trtllm_gateway:remote_prefill_total", 'outcome="local_fallback"') >= 1
