"""Each tool-call family over HTTP: the real chat template (--chat-template), `auto` picking the
parser from it, and the FakeEngine replying with the call as that template renders one; the
non-streamed message holds the calls and the stream reassembles to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from tests.api.agent_helpers import message_view, reassemble, without_ids
from tests.api.sse_helpers import parse_sse
from tests.conftest import MODEL, wait_ready
from tests.fake_engine import FakeEngine
from tests.unit.test_tool_parsers_templates import (
    FAMILIES,
    TEMPLATES,
    TOOLS,
    rendered_reply,
    template_tokenizer,
)
from trtllm_gateway.app.main import create_app
from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.protocol import EngineInfo
from trtllm_gateway.engine.tokenizer import Tokenizer

URL = "/v1/chat/completions"
LONG = 4096  # room for the long system prompts of real templates


def long_engine(engine_info: EngineInfo, script: list[int]) -> FakeEngine:
    info = EngineInfo(
        model_id=MODEL,
        max_model_len=LONG,
        vocab_size=engine_info.vocab_size,
        eos_token_ids=engine_info.eos_token_ids,
        engine="fake",
    )
    return FakeEngine(info, script, tokens_per_event=3)


async def post_all(settings: Settings, engine: FakeEngine, bodies: list[Any]) -> list[Any]:
    """Each body in turn to an app over `engine`; the raw responses."""
    app = create_app(settings.model_copy(update={"max_model_len": LONG}).parts(), engine=engine)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await wait_ready(client)
            return [await client.post(URL, json=body) for body in bodies]


@pytest.mark.parametrize(
    ("template", "family", "turn", "calls", "reasoning"), FAMILIES, ids=[f[0] for f in FAMILIES]
)
async def test_family_over_http(
    tokenizer_dir: Path,
    engine_info: EngineInfo,
    template: str,
    family: str,
    turn: str,
    calls: list[tuple[str, Any]],
    reasoning: str | None,
) -> None:
    reply = rendered_reply(template_tokenizer(tokenizer_dir, template), calls, turn)
    settings = Settings(
        model=str(tokenizer_dir),
        served_model_name=MODEL,
        chat_template=str(TEMPLATES / template),
        reasoning_parser=reasoning,  # type: ignore[arg-type]
    )
    script = Tokenizer.from_dir(tokenizer_dir).encode(reply, add_special_tokens=False)
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
        "tools": TOOLS,
        "max_tokens": 1000,
    }
    responses = await post_all(
        settings, long_engine(engine_info, script), [body, {**body, "stream": True}]
    )
    whole, stream = responses[0].json(), responses[1]
    view = message_view(whole)
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in view["tool_calls"]
    ]
    assert got == calls and view["finish_reason"] == "tool_calls"
    assert view["content"] == ""
    assert without_ids(reassemble(parse_sse(stream.text))) == without_ids(view)


async def test_forced_call_under_mistral_has_an_id_its_template_takes_back(
    tokenizer_dir: Path, engine_info: EngineInfo
) -> None:
    """tool_choice naming a function, on a Mistral model: the call's id is 9 letters and digits
    (Mistral's own templates raise on any other) and the next turn renders with it."""
    import re

    settings = Settings(
        model=str(tokenizer_dir),
        served_model_name=MODEL,
        chat_template=str(TEMPLATES / "mistral_parallel.jinja"),
    )
    args = '{"city": "Paris"}'
    script = Tokenizer.from_dir(tokenizer_dir).encode(args, add_special_tokens=False)
    ask = {"role": "user", "content": "Weather in Paris?"}
    named = {"type": "function", "function": {"name": "get_weather"}}
    body: dict[str, Any] = {"model": MODEL, "messages": [ask], "tools": TOOLS, "max_tokens": 50}
    (first,) = await post_all(
        settings, long_engine(engine_info, script), [{**body, "tool_choice": named}]
    )
    (call,) = first.json()["choices"][0]["message"]["tool_calls"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"]), call["id"]
    history = [
        ask,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "18 C"},
    ]
    (second,) = await post_all(
        settings, long_engine(engine_info, script), [{**body, "messages": history}]
    )
    assert second.status_code == 200, second.text


async def test_reasoning_effort_reaches_the_gpt_oss_template(
    settings: Settings, engine_info: EngineInfo, tokenizer: Tokenizer
) -> None:
    settings = settings.model_copy(update={"chat_template": str(TEMPLATES / "gpt_oss.jinja")})
    engine = long_engine(engine_info, tokenizer.encode("ok", add_special_tokens=False))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    kwargs = {"chat_template_kwargs": {"reasoning_effort": "low"}}
    bodies = [
        body,
        {**body, "reasoning_effort": "high"},
        {**body, "reasoning_effort": "high", **kwargs},
    ]
    assert all(r.status_code == 200 for r in await post_all(settings, engine, bodies))
    prompts = [
        tokenizer.decode(r.prompt_token_ids, skip_special_tokens=False) for r in engine.requests
    ]
    assert "Reasoning: medium" in prompts[0]
    assert "Reasoning: high" in prompts[1]
    assert "Reasoning: low" in prompts[2]
