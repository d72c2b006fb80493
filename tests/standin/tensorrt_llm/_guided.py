"""Stand-in guided decoding: a token bitmask over the scripted "model", as TensorRT-LLM applies it.

TensorRT-LLM 1.2 builds one guided decoder per LLM when `guided_decoding_backend` is set, from
the model's tokenizer, and masks every step's logits with the grammar's allowed tokens
(_torch/pyexecutor/grammar_matcher.py). With llguidance: `json` -> grammar_from_json_schema,
`json_object` -> the schema {"type": "object"}, `regex` -> grammar_from_regex, `grammar` ->
grammar_from_lark. xgrammar reads `grammar` as EBNF (GBNF here). llguidance stands in for both.

The scripted model keeps its own token when the mask allows it; otherwise it ends (end_id) if
the grammar may end there, else takes an allowed token picked by its own choice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
from tensorrt_llm.executor.utils import RequestError


class GuidedDecoder:
    """One per LLM; the tokenizer loads on the first guided request."""

    def __init__(self, model_dir: Path, backend: str, vocab_size: int) -> None:
        self._model_dir = model_dir
        self._backend = backend
        self._vocab_size = vocab_size
        self._tokenizer: Any = None

    def start(self, params: Any, end_id: int) -> Guide:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                hf = AutoTokenizer.from_pretrained(self._model_dir, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise RequestError(f"guided decoding needs the model's tokenizer: {exc}") from None
            self._tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=self._vocab_size)
        matcher = llguidance.LLMatcher(self._tokenizer, self._grammar(params))
        if matcher.is_error():
            raise RequestError(f"{self._backend} grammar error: {matcher.get_error()}")
        return Guide(matcher, end_id, self._vocab_size)

    def _grammar(self, params: Any) -> str:
        m = llguidance.LLMatcher
        if params.json_object:
            return m.grammar_from_json_schema('{"type": "object"}')
        if params.json is not None:
            schema = params.json if isinstance(params.json, str) else json.dumps(params.json)
            return m.grammar_from_json_schema(schema)
        if params.regex is not None:
            return m.grammar_from_regex(params.regex)
        if params.grammar is not None:
            if self._backend == "llguidance":
                return m.grammar_from_lark(params.grammar)
            return llguidance.grammar_from("gbnf", params.grammar)
        raise RequestError("guided_decoding has no guide set")


class Guide:
    """One request's matcher: pick() the token the mask allows, accept() what was emitted."""

    def __init__(self, matcher: Any, end_id: int, vocab_size: int) -> None:
        self._matcher = matcher
        self._end_id = end_id
        self._vocab_size = vocab_size

    def pick(self, token: int) -> int:
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint32)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self._vocab_size]
        if token < len(bits) and bits[token]:
            return token
        if self._matcher.is_accepting() or (self._end_id < len(bits) and bits[self._end_id]):
            return self._end_id
        allowed = np.flatnonzero(bits)
        if len(allowed) == 0:
            raise RequestError("guided decoding: no token is allowed")
        return int(allowed[token % len(allowed)])

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise RequestError(f"guided decoding rejected token {token}")
