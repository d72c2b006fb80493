"""Parse for /v1/chat/completions: the request checked, its images loaded, the chat template
rendered, and one engine request per choice; with them the reply plan (reasoning and tool-call
parsing, a forced call) and the output constraint that plan implies."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from trtllm_gateway.engine.protocol import GuidedDecoding
from trtllm_gateway.multimodal import PixelLease
from trtllm_gateway.reasoning import end_marker
from trtllm_gateway.routers.openai import sampling
from trtllm_gateway.routers.openai.chat.images import load_images, template_messages
from trtllm_gateway.routers.openai.chat.reply import ReplyPlan
from trtllm_gateway.routers.openai.fanout import Choice
from trtllm_gateway.routers.openai.run import Run
from trtllm_gateway.routers.openai.schemas import ChatCompletionRequest
from trtllm_gateway.routers.openai.structured import (
    Constraint,
    build_constraint,
    check_constraint,
    check_tools,
    named_tool,
    start_after,
)
from trtllm_gateway.tool_parsers import resolve_tool_parser
from trtllm_gateway.web.deps import Serving
from trtllm_gateway.web.errors import BadRequestError
from trtllm_gateway.web.state import State


@dataclass(frozen=True, slots=True)
class ParsedChat:
    """What the render step needs besides the run's deltas."""

    choices: list[Choice]
    reply: ReplyPlan
    prompt_tokens: int


async def parse_chat(
    body: ChatCompletionRequest,
    serving: Serving,
    state: State,
    run: Run,
    pixels: PixelLease,
    clamp_max_tokens: bool = False,
) -> ParsedChat:
    """Checks, images, the chat template, then n choices over the one prompt. `pixels`: the
    request's lease on the decoded-pixel budget, released by the caller when the response ends.
    clamp_max_tokens: a max_tokens past the context is cut to what remains (Anthropic's required
    max_tokens, which clients set for their largest model), not a 400."""
    _check(body, serving)
    constraint = build_constraint(body)  # its 400s before any templating or fetching
    images = tuple(await load_images(body.messages, serving.info, state, pixels))
    messages = template_messages(body.messages, serving.tokenizer)
    prompt = await asyncio.to_thread(
        serving.tokenizer.encode_chat,
        messages,
        add_generation_prompt=body.add_generation_prompt,
        chat_template_kwargs=template_kwargs(body),
        tools=template_tools(body),
    )
    requested = body.max_completion_tokens or body.max_tokens
    if clamp_max_tokens and requested is not None:
        # A prompt that fills the context still gets its 400 (resolve_max_tokens).
        requested = max(1, min(requested, serving.info.max_model_len - len(prompt)))
    max_tokens = sampling.resolve_max_tokens(requested, len(prompt), serving.info.max_model_len)
    plan = reply_plan(body, serving, prompt)
    guided = await guided_decoding(constraint, serving, plan)
    top_n = body.top_logprobs or 0
    choices = []
    for i in range(body.n):
        params = sampling.sampling_params(
            body,
            max_tokens,
            logprobs=top_n if body.logprobs else None,
            seed_offset=i,
            guided=guided,
        )
        keep = plan.keeps_special_tokens
        choices.append(run.choice(i, prompt, params, images, keep_special_tokens=keep))
    return ParsedChat(choices, plan, len(prompt))


def _check(body: ChatCompletionRequest, serving: Serving) -> None:
    sampling.check_common(body, serving)
    if not body.messages:
        raise BadRequestError("messages must not be empty.", param="messages")
    if body.top_logprobs and not body.logprobs:
        raise BadRequestError("top_logprobs requires logprobs=true.", param="top_logprobs")
    sampling.check_logprobs(body.top_logprobs, "top_logprobs", serving.config.max_logprobs)
    check_tools(body)


def template_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as the chat template takes them (OpenAI's shape, unset fields left out)."""
    if not body.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in body.tools]


def template_kwargs(body: ChatCompletionRequest) -> dict[str, Any] | None:
    """chat_template_kwargs, with OpenAI's reasoning_effort passed as the template variable of
    that name (gpt-oss) unless the kwargs set it."""
    if body.reasoning_effort is None:
        return body.chat_template_kwargs
    return {"reasoning_effort": body.reasoning_effort, **(body.chat_template_kwargs or {})}


def thinking_enabled(body: ChatCompletionRequest) -> bool:
    """False when chat_template_kwargs turn thinking off (Qwen3 enable_thinking, V3.1 thinking)."""
    kwargs = body.chat_template_kwargs or {}
    return kwargs.get("enable_thinking", True) is not False and kwargs.get("thinking") is not False


def reply_plan(body: ChatCompletionRequest, serving: Serving, prompt: list[int]) -> ReplyPlan:
    config = serving.config
    reasoning = config.reasoning_parser
    model_family = None  # the model's own tool-call format
    if body.tools:
        model_family = resolve_tool_parser(config.tool_call_parser, serving.tokenizer.chat_template)
    family = model_family if body.tool_choice in (None, "auto") else None
    tool = named_tool(body)
    tail = ""
    if reasoning is not None:
        tail = serving.tokenizer.decode(prompt[-8:], skip_special_tokens=False)
    return ReplyPlan(
        reasoning=reasoning,
        tool_family=family,
        forced_tool=None if tool is None else tool.function.name,
        required=bool(body.tools) and body.tool_choice == "required",
        limit=1 if body.parallel_tool_calls is False else None,
        prompt_tail=tail,
        thinking=thinking_enabled(body),
        id_family=model_family,
    )


async def guided_decoding(
    constraint: Constraint | None, serving: Serving, plan: ReplyPlan
) -> GuidedDecoding | None:
    """The request's constraint (build_constraint), checked; with a reasoning parser and
    thinking on, it applies once the reasoning has ended."""
    if constraint is None:
        return None
    if plan.reasoning is not None and plan.thinking:
        marker = end_marker(plan.reasoning)
        ids = serving.tokenizer.encode(marker, add_special_tokens=False)
        constraint = start_after(constraint, tuple(ids))
    await check_constraint(constraint, serving.config.max_grammar_bytes)
    return constraint.guided
