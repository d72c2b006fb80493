"""Parse for /v1/completions: the request checked, its prompt(s) tokenized (text or token ids,
one or a batch), and n engine requests per prompt."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from trtllm_gateway.engine.protocol import check_token_ids
from trtllm_gateway.routers.openai import sampling, validation
from trtllm_gateway.routers.openai.fanout import Choice
from trtllm_gateway.routers.openai.run import Run
from trtllm_gateway.routers.openai.schemas import CompletionRequest
from trtllm_gateway.routers.openai.structured import build_constraint, check_constraint
from trtllm_gateway.web.deps import Serving
from trtllm_gateway.web.errors import BadRequestError


@dataclass(slots=True)
class Prompt:
    token_ids: list[int]
    text: str | None  # as sent, when sent as text


@dataclass(frozen=True, slots=True)
class ParsedCompletion:
    """The choices (index = prompt * n + j) and each one's prompt, which echo renders."""

    choices: list[Choice]
    prompts: list[Prompt]


def prompt_count(prompt: object) -> int:
    """Prompts in a completions `prompt` (text, token ids, or a batch of either), unparsed."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


async def parse_completion(body: CompletionRequest, serving: Serving, run: Run) -> ParsedCompletion:
    """Checks, tokenization, then n choices per prompt (choice index = prompt * n + j)."""
    _check(body, serving)
    constraint = build_constraint(body)
    if constraint is not None:
        await check_constraint(constraint, serving.config.max_grammar_bytes)
    prompts = await asyncio.to_thread(_tokenize, body, serving)
    want_prompt_logprobs = body.echo and body.logprobs is not None
    parsed = ParsedCompletion([], [])
    for prompt in prompts:
        max_tokens = sampling.resolve_max_tokens(
            body.max_tokens, len(prompt.token_ids), serving.info.max_model_len
        )
        for j in range(body.n):
            params = sampling.sampling_params(
                body,
                max_tokens,
                logprobs=body.logprobs,
                prompt_logprobs=body.logprobs if want_prompt_logprobs else None,
                seed_offset=j,
                guided=None if constraint is None else constraint.guided,
            )
            parsed.choices.append(run.choice(len(parsed.choices), prompt.token_ids, params))
            parsed.prompts.append(prompt)
    return parsed


def _check(body: CompletionRequest, serving: Serving) -> None:
    sampling.check_common(body, serving)
    sampling.check_logprobs(body.logprobs, "logprobs", serving.config.max_logprobs)
    if body.suffix:
        raise BadRequestError("suffix is not supported.", param="suffix")
    for field_name in ("tools", "tool_choice"):
        if (body.model_extra or {}).get(field_name) is not None:
            raise BadRequestError(
                f"{field_name} is only supported on /v1/chat/completions.", param=field_name
            )
    if isinstance(body.prompt, list) and not body.prompt:
        raise BadRequestError("prompt must not be empty.", param="prompt")
    validation.check_choice_count(prompt_count(body.prompt), body.n)


def _tokenize(body: CompletionRequest, serving: Serving) -> list[Prompt]:
    tok = serving.tokenizer
    prompt = body.prompt
    if isinstance(prompt, str):
        return [Prompt(tok.encode(prompt), prompt)]
    if all(isinstance(p, str) for p in prompt):
        return [Prompt(tok.encode(str(p)), str(p)) for p in prompt]
    id_lists = [prompt] if all(isinstance(p, int) for p in prompt) else prompt
    vocab = validation.vocab_bound(serving.info.vocab_size, tok.vocab_size)
    out = []
    for ids in id_lists:
        token_ids = [t for t in ids if isinstance(t, int)] if isinstance(ids, list) else []
        if len(token_ids) != (len(ids) if isinstance(ids, list) else -1):
            raise BadRequestError("prompt must be text or token ids.", param="prompt")
        check_token_ids(token_ids, vocab, "prompt")  # a 400 through web/errors.py
        out.append(Prompt(token_ids, None))
    return out
