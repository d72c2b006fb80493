"""Compile a GuidedDecoding into an llguidance grammar, validate it, cache it by hash."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from llguidance import LLMatcher

from trtllm_gateway.engine.protocol import GuidedDecoding, GuidedKind, InvalidRequestError

# The request field each kind comes from, for errors raised without an explicit param.
DEFAULT_PARAMS: dict[GuidedKind, str] = {
    "json": "response_format.json_schema.schema",
    "json_object": "response_format",
    "regex": "structured_outputs.regex",
    "grammar": "structured_outputs.grammar",
}

# Compact JSON with one space after separators: no free whitespace, so a model cannot pad an
# object with newlines until max_tokens, and the output stays what OpenAI's models emit.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_ANY_OBJECT = '{"type": "object"}'
_CACHE_SIZE = 512

_lock = threading.Lock()
_cache: OrderedDict[bytes, str] = OrderedDict()


def check_guided(
    guided: GuidedDecoding, max_grammar_bytes: int, *, param: str | None = None
) -> None:
    """Raise InvalidRequestError (with .param) unless the constraint compiles within the limit."""
    name = param or DEFAULT_PARAMS[guided.kind]
    size = len(guided.spec.encode())
    if max_grammar_bytes > 0 and size > max_grammar_bytes:
        raise InvalidRequestError(
            f"the {guided.kind} constraint is {size} bytes, more than the limit of "
            f"{max_grammar_bytes} (--max-grammar-bytes)",
            param=name,
        )
    if any(t < 0 for t in guided.start_after):
        raise InvalidRequestError("start_after token ids must be >= 0", param=name)
    grammar_for(guided, param=name)


def grammar_for(guided: GuidedDecoding, *, param: str | None = None) -> str:
    """The validated llguidance grammar of a constraint, compiled once per (kind, spec)."""
    key = hashlib.blake2b(f"{guided.kind}\0{guided.spec}".encode(), digest_size=16).digest()
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    grammar = _compile(guided, param or DEFAULT_PARAMS[guided.kind])
    with _lock:
        _cache[key] = grammar
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return grammar


def _compile(guided: GuidedDecoding, param: str) -> str:
    kind, spec = guided.kind, guided.spec
    try:
        if kind == "json":
            grammar = LLMatcher.grammar_from_json_schema(spec, defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
        elif kind == "json_object":
            grammar = LLMatcher.grammar_from_json_schema(_ANY_OBJECT, defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
        elif kind == "regex":
            grammar = LLMatcher.grammar_from_regex(spec)
        else:
            grammar = LLMatcher.grammar_from_lark(spec)
    except (ValueError, TypeError) as e:
        raise InvalidRequestError(f"invalid {_label(kind)}: {e}", param=param) from e
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise InvalidRequestError(f"invalid {_label(kind)}: {error.strip()}", param=param)
    return grammar


def _label(kind: GuidedKind) -> str:
    return {
        "json": "JSON schema",
        "json_object": "JSON object constraint",
        "regex": "regular expression",
        "grammar": "Lark grammar",
    }[kind]
