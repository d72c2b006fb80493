"""Hostile-input checks at the HTTP edge: every token id the API takes against the vocabulary
(engine/protocol.py's check_token_ids, the one check),
logit_bias keys and values, and request strings the tokenizer cannot take (lone UTF-16
surrogates) or nesting deep enough to exhaust the recursion limit of a chat template; and the
SamplingParams a sibling sends whole to /internal/v1/prefill, held to the same ranges.

The vocabulary bound is the model's (EngineInfo.vocab_size: the width of its logits and its
embedding table), not the tokenizer's length: an id the tokenizer knows but the model does not
would index past the logits; an id in the model's padded tail is harmless. A tokenizer's length
stands in only when the engine does not report a vocabulary (0).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from trtllm_gateway.engine.protocol import InvalidRequestError, SamplingParams, check_token_ids
from trtllm_gateway.routers.openai.schemas import SamplingFields
from trtllm_gateway.web.errors import BadRequestError

LOGIT_BIAS_LIMIT = 100.0  # OpenAI clamps biases to [-100, 100]
# Objects/arrays inside a request. transformers' templating recurses about two frames a level
# (~500 levels hit Python's recursion limit, a 500); deep JSON schemas get llguidance's own 400.
MAX_DEPTH = 128
# Choices one request may start (n x prompts): 200 000 one-token prompts in a 1.2 MB body would
# otherwise occupy the engine for minutes. OpenAI's limit on a prompt array is 2048 entries.
MAX_CHOICES = 2048
# Text that could not fit the context whatever it tokenizes to: tokenizing 10 MB took 85 s
# before its 400. Generous: a token of a real tokenizer rarely spans more than a few dozen
# characters (runs of spaces or '=' are the longest).
MAX_CHARS_PER_TOKEN = 64
# Stop strings a request may give, and their characters in all. OpenAI takes at most 4, TGI 4
# by default (--max-stop-sequences), vLLM any number; 12,000 of them with n=16 took others' time
# to first token from 0.16 s to 9.1 s (issue 40) when each token ran every one of them. The
# check is an automaton now (routers/openai/stop_strings.py), linear in the text; these bound its
# build.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096
_SURROGATE = re.compile("[\ud800-\udfff]")
# The URLs of image parts are not text: an image_embeds data: URL of a real model's embedding is
# millions of characters (576 x 4096 fp16: 6.3 M base64), bounded by --max-image-bytes once
# decoded and by the context once expanded in the engine (issue 40 item 7).
_MEDIA_URL = re.compile(r"^messages\[\d+\]\.content\[\d+\]\.(image_url|image_embeds)(\.url)?$")
# A token id has at most a handful of digits; a longer key is refused before int() (whose
# 4300-digit limit raised ValueError, a 500) and before it costs quadratic time.
_PROMPT_ITEM = re.compile(r"prompt\[\d+\]")
_TOKEN_KEY = re.compile(r"-?[0-9]{1,12}")


def vocab_bound(engine_vocab: int, tokenizer_vocab: int) -> int:
    """The exclusive upper bound for token ids: the model's vocabulary when the engine knows it."""
    return engine_vocab if engine_vocab > 0 else tokenizer_vocab


def logit_bias_pairs(raw: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({"token id": bias}) as (id, bias) pairs, biases clamped to
    [-100, 100]; a key that is not a decimal integer or a value that is not finite is a 400."""
    pairs: dict[int, float] = {}
    for key, bias in (raw or {}).items():
        if not _TOKEN_KEY.fullmatch(key):
            raise BadRequestError(
                f"logit_bias keys must be token ids (decimal integers); got {_printable(key)!r}.",
                param="logit_bias",
            )
        if not math.isfinite(bias):
            raise BadRequestError("logit_bias values must be finite numbers.", param="logit_bias")
        pairs[int(key)] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, bias))
    return tuple(pairs.items())


def check_sampling_ids(body: SamplingFields, vocab: int) -> None:
    """stop_token_ids, logit_bias keys and allowed_token_ids inside [0, vocab), each a 400
    naming its field; allowed_token_ids, when given, is not empty."""
    bias_ids = (t for t, _ in logit_bias_pairs(body.logit_bias))
    _check_ids(body.stop_token_ids or (), bias_ids, body.allowed_token_ids, vocab)


def _check_ids(
    stop: Iterable[int], bias: Iterable[int], allowed: Sequence[int] | None, vocab: int
) -> None:
    try:
        check_token_ids(stop, vocab, "stop_token_ids")
        check_token_ids(bias, vocab, "logit_bias")
        if allowed is not None and not allowed:
            raise InvalidRequestError(
                "allowed_token_ids must not be empty.", param="allowed_token_ids"
            )
        check_token_ids(allowed or (), vocab, "allowed_token_ids")
    except InvalidRequestError as e:  # a GatewayError, whose param the agent APIs rename
        raise BadRequestError(str(e), param=e.param) from None


def check_stop_strings(stops: Sequence[str]) -> None:
    """At most MAX_STOP_STRINGS stop strings, MAX_STOP_CHARS characters in all."""
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequestError(
            f"stop takes at most {MAX_STOP_STRINGS} strings; got {len(stops)}.", param="stop"
        )
    chars = sum(len(s) for s in stops)
    if chars > MAX_STOP_CHARS:
        raise BadRequestError(
            f"stop strings may hold at most {MAX_STOP_CHARS} characters in all; got {chars}.",
            param="stop",
        )


def check_choice_count(prompts: int, n: int) -> None:
    """At most MAX_CHOICES engine requests (n per prompt) from one HTTP request."""
    if prompts * n > MAX_CHOICES:
        raise BadRequestError(
            f"{prompts} prompts x n={n} is {prompts * n} choices, more than {MAX_CHOICES}.",
            param="prompt",
        )


def check_values(body: BaseModel, max_text_chars: int | None = None) -> None:
    """A 400 naming the field for a lone surrogate in any string (or object key) of the
    request, or for nesting deeper than MAX_DEPTH; and a 400 when the request's text (every
    string but the URLs of image_url and image_embeds parts; each element of a completions
    prompt list on its own, as each is its own prompt) is longer than max_text_chars, before
    anything tokenizes it."""
    chars: dict[str, int] = {}
    for path, value, depth in _walk(body):
        if depth > MAX_DEPTH:
            raise BadRequestError(
                f"{_param(path) or 'body'} is nested more than {MAX_DEPTH} levels deep.",
                param=_param(path),
            )
        if not isinstance(value, str):
            continue
        if _SURROGATE.search(value):
            raise BadRequestError(
                f"{_printable(path)} holds a lone UTF-16 surrogate (not valid Unicode).",
                param=_param(path),
            )
        if _MEDIA_URL.search(path):
            continue
        group = _PROMPT_ITEM.match(path)
        key = group.group(0) if group else ""
        chars[key] = chars.get(key, 0) + len(value)
        if max_text_chars is not None and chars[key] > max_text_chars:
            raise BadRequestError(
                f"the request's text is longer than {max_text_chars} characters, more than "
                "the model's context could hold; it was not tokenized.",
                param=_param(path),
                code="context_length_exceeded",
            )


def _param(path: str) -> str | None:
    """The top-level field of a path ('messages[0].content' -> 'messages')."""
    return _printable(re.split(r"[.\[]", path, maxsplit=1)[0]) or None


def _printable(text: str) -> str:
    """Text safe to put in an error body: surrogates spelled as \\udXXX escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _walk(root: BaseModel) -> Iterator[tuple[str, Any, int]]:
    """(path, value, depth) for every value under the model, iteratively (no recursion to
    exhaust); object keys are yielded as values of their own path."""
    stack: list[tuple[str, Any, int]] = [("", root, 0)]
    while stack:
        path, value, depth = stack.pop()
        yield path, value, depth
        if depth > MAX_DEPTH:
            return
        if isinstance(value, BaseModel):
            fields = type(value).model_fields
            items = [(fields[n].alias or n, getattr(value, n)) for n in fields]
            items += list((value.model_extra or {}).items())
            stack.extend((_join(path, k), v, depth + 1) for k, v in items if v is not None)
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((_join(path, str(k)), k, depth + 1))
                stack.append((_join(path, str(k)), v, depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_SAMPLING = TypeAdapter(SamplingParams)
# (field, lowest, highest): the public API's ranges, for SamplingParams that arrive whole.
_RANGES: tuple[tuple[str, float, float], ...] = (
    ("max_tokens", 1, math.inf),
    ("min_tokens", 0, math.inf),
    ("temperature", 0.0, 2.0),
    ("top_p", 5e-324, 1.0),
    ("top_k", 0, math.inf),
    ("min_p", 0.0, 1.0),
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
    ("repetition_penalty", 5e-324, sys.float_info.max),  # finite
    ("seed", -(2**63), 2**63 - 1),
)


def sibling_sampling(wire: SamplingParams, vocab: int, max_logprobs: int) -> SamplingParams:
    """SamplingParams rebuilt from a sibling's JSON (/internal/v1/prefill), typed and held to the
    public API's ranges: whoever can reach that endpoint must not be able to hand the engine a
    value no public request could (a string seed, k past the vocabulary, NaN)."""
    try:
        sp = _SAMPLING.validate_python(asdict(wire))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequestError(f"sampling.{where}: {first['msg']}", param="sampling") from None
    for name, low, high in _RANGES:
        value = getattr(sp, name)
        if value is not None and not low <= value <= high:  # NaN fails both comparisons
            raise BadRequestError(f"sampling.{name} {value!r} is out of range.", param="sampling")
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(sp, name)
        if k is not None and not 0 <= k <= max_logprobs:
            raise BadRequestError(f"sampling.{name} must be in [0, {max_logprobs}].", param=name)
    if not all(math.isfinite(bias) for _, bias in sp.logit_bias):
        raise BadRequestError("logit_bias values must be finite numbers.", param="logit_bias")
    _check_ids(sp.stop_token_ids, (t for t, _ in sp.logit_bias), sp.allowed_token_ids, vocab)
    return sp


def renamed_param(param: str | None, names: dict[str, str]) -> str | None:
    """An error's param from a translated chat request, named as the caller's API names it.

    names: chat's field -> the API's (an agent API's translator); "messages" names only the
    field, since the translation shifts message indexes."""
    for chat, ours in names.items():
        if param is not None and (param == chat or param.startswith((chat + ".", chat + "["))):
            return ours if chat == "messages" else ours + param[len(chat) :]
    return param
