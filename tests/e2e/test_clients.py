"""Real clients, unmodified, against a live gateway on the real default model (SmolLM2 on the
built-in engine): the calls that failed for them before (issue 27) run here as their users write
them.

- tool arguments carry no undeclared key: the README's get_weather tool (no additionalProperties)
  through the openai SDK, LiteLLM's hosted_vllm provider, LangChain's
  with_structured_output(method="function_calling"), Instructor's TOOLS mode and an
  openai-agents Agent;
- prompt_tokens_total moves by usage.prompt_tokens when a stop string ends the request;
- every query of vLLM's example Grafana dashboard (deploy/grafana/) finds series that move,
  against a server with --metrics-prefix vllm:, and the default-prefix copy likewise;
- docs/benchmark_clients.md's AIPerf and guidellm block runs as written.

Instructor, AIPerf and guidellm pin versions the project's venv cannot hold (`make clients`
installs them in .venv-clients); they run as subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.dashboards import dashboard_selectors, matching, scrape
from tests.e2e.server import ROOT, Server

MODEL = "SmolLM2-135M-Instruct"
CLIENTS = ROOT / ".venv-clients" / "bin"
# The README's get_weather tool as its Python snippet declares it: no additionalProperties.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# Third-party clients warn on import (deprecations of their own dependencies).
pytestmark = pytest.mark.filterwarnings("ignore")


def get_weather(city: str) -> str:
    """The function a client calls with the model's arguments: extra keys are a TypeError."""
    return f"18C and sunny in {city}"


@pytest.fixture(scope="module")
def vllm_server(log_dir: Path) -> Iterator[Server]:
    """The default model, engine metrics under vLLM's names."""
    srv = Server(args=["--num-kv-blocks", "512", "--metrics-prefix", "vllm:"]).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def clients_venv() -> Path:
    assert (CLIENTS / "python").exists(), "run `make clients` (instructor, aiperf, guidellm)"
    return CLIENTS


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_openai_sdk_tool_arguments_are_declared(vllm_server: Server, tool_choice: Any) -> None:
    client = openai.OpenAI(base_url=f"{vllm_server.url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=tool_choice, temperature=0
    )
    (call,) = reply.choices[0].message.tool_calls or ()
    assert reply.choices[0].message.content is None
    get_weather(**json.loads(call.function.arguments))  # was {"city": ..., "location": ...}


def test_litellm_hosted_vllm_tool_arguments_are_declared(
    vllm_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LiteLLM's hosted_vllm provider drops additionalProperties before sending; the call still
    has only the declared keys."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch on import
    import litellm

    closed = json.loads(json.dumps(WEATHER))
    closed["function"]["parameters"]["additionalProperties"] = False
    reply = litellm.completion(
        model=f"hosted_vllm/{MODEL}",
        api_base=f"{vllm_server.url}/v1",
        api_key="unused",
        messages=ASK,
        tools=[closed],
        tool_choice="required",
        temperature=0,
    )
    (call,) = reply.choices[0].message.tool_calls
    get_weather(**json.loads(call.function.arguments))


def test_langchain_structured_output_function_calling(vllm_server: Server) -> None:
    """with_structured_output(method="function_calling") used to nest undeclared keys until
    max_tokens (parsed None)."""
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(description="The person's name")
        age: int

    llm = ChatOpenAI(
        base_url=f"{vllm_server.url}/v1",
        api_key="unused",
        model=MODEL,
        temperature=0,
        max_tokens=200,
    )
    chain = llm.with_structured_output(Person, method="function_calling", include_raw=True)
    out = chain.invoke("Alice is 30 years old. Extract the person.")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Person)
    (call,) = out["raw"].tool_calls
    assert set(call["args"]) <= {"name", "age"}


def test_openai_agents_calls_the_tool(vllm_server: Server) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace export to OpenAI
    calls: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return get_weather(city)

    sdk = openai.AsyncOpenAI(base_url=f"{vllm_server.url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="forecaster",
        instructions="Answer weather questions with the tool.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=sdk),
        tools=[weather],
        model_settings=ModelSettings(tool_choice="weather", temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?")
    assert len(calls) == 1 and result.final_output == get_weather(calls[0])


INSTRUCTOR = """
import json, sys
import instructor, openai
from pydantic import BaseModel, Field

class Item(BaseModel):
    name: str = Field(max_length=20)
    price: float

class Order(BaseModel):
    items: list[Item] = Field(max_length=3)

client = instructor.from_openai(openai.OpenAI(base_url=sys.argv[1], api_key="unused"),
                                mode=instructor.Mode.TOOLS)
order, raw = client.chat.completions.create_with_completion(
    model=sys.argv[2], response_model=Order, temperature=0, max_tokens=200, max_retries=0,
    messages=[{"role": "user", "content": "I bought an apple for 1.5 and bread for 3."}])
print(json.dumps({"order": order.model_dump(),
                  "arguments": raw.choices[0].message.tool_calls[0].function.arguments}))
"""


def test_instructor_tools_mode_list_items_have_declared_keys(vllm_server: Server) -> None:
    """Instructor's TOOLS mode (instructor 1.17 needs openai<4 and jiter<0.15: .venv-clients)
    used to get three undeclared keys per list item."""
    python = clients_venv() / "python"
    r = subprocess.run(
        [str(python), "-c", INSTRUCTOR, f"{vllm_server.url}/v1", MODEL],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    items = json.loads(out["arguments"])["items"]
    assert items and all(set(item) <= {"name", "price"} for item in items)
    assert len(out["order"]["items"]) == len(items)


def test_stop_string_counts_the_prompt(vllm_server: Server) -> None:
    before = vllm_server.metric("vllm:prompt_tokens_total")
    body = {
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 16,
        "temperature": 0,
        "stop": [" "],  # the gateway ends it on the first space, before the engine's last event
    }
    reply = httpx.post(f"{vllm_server.url}/v1/completions", json=body, timeout=120).json()
    assert reply["choices"][0]["finish_reason"] == "stop"
    after = vllm_server.metric("vllm:prompt_tokens_total")
    assert after - before == reply["usage"]["prompt_tokens"] > 0


def _traffic(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for stream in (False, True):
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=8, stream=stream, n=2
        )
        if stream:
            list(reply)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dashboard", "prefixed"),
    [("vllm-grafana.json", True), ("trtllm-gateway-grafana.json", False)],
)
def test_grafana_dashboard_has_no_empty_panel(
    vllm_server: Server, server: Server, dashboard: str, prefixed: bool
) -> None:
    """vLLM's example dashboard, as vLLM 0.33.0 ships it, against --metrics-prefix vllm:; its
    default-prefix copy against the default server. Every selector finds series, and those
    under rate()/increase() move with traffic, so each of the 13 panels draws."""
    path = ROOT / "deploy" / "grafana" / dashboard
    vllm_text = (ROOT / "deploy" / "grafana" / "vllm-grafana.json").read_text()
    assert path.read_text() == (
        vllm_text if prefixed else vllm_text.replace("vllm:", "trtllm_gateway:")
    )
    target = vllm_server if prefixed else server
    selectors = dashboard_selectors(path, MODEL)
    assert len({s.panel for s in selectors}) == 13
    before = scrape(target.url)
    _traffic(target.url)
    after = scrape(target.url)
    for sel in selectors:
        value = matching(after, sel)
        if sel.ranged:  # a labelled series first appears with its first request
            earlier = matching(before, sel) if any(k[0] == sel.name for k in before) else 0.0
            assert value > earlier, f"{sel} did not move"
    # the dashboard's model_name variable: label_values(model_name)
    assert any(("model_name", MODEL) in labels for _, labels in after)


def _readme_bench_block() -> str:
    text = (ROOT / "docs" / "benchmark_clients.md").read_text()
    match = re.search(r"<!-- bench-clients -->\n```bash\n(.*?)```", text, re.S)
    assert match is not None
    return match.group(1)


def test_readme_aiperf_and_guidellm_block_runs(vllm_server: Server, tmp_path: Path) -> None:
    """docs/benchmark_clients.md's block, verbatim but for the server address and /tmp, with the
    client venv first in PATH (AIPerf finds the tokenizer through /v1/models root, no hub)."""
    script = _readme_bench_block()
    script = script.replace("http://localhost:8000", vllm_server.url)
    script = script.replace("/tmp/", f"{tmp_path}/")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["PATH"] = f"{clients_venv()}{os.pathsep}{env['PATH']}"
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    aiperf = json.loads((tmp_path / "aiperf" / "profile_export_aiperf.json").read_text())
    assert aiperf["request_count"]["avg"] == 4  # the README's --request-count
    guidellm = json.loads((tmp_path / "guidellm" / "benchmarks.json").read_text())
    assert guidellm["benchmarks"], guidellm.keys()
