"""Guided (constrained) decoding with llguidance: compile, validate, cache; per-request matchers.

Public API (the HTTP side calls the first before a request reaches any engine, through
asyncio.to_thread since a large schema takes milliseconds to compile):

    check_guided(guided: GuidedDecoding, max_grammar_bytes: int, *, param: str | None = None)
        -> None
        Raises InvalidRequestError (with .param set to `param`, or to a default naming the
        spec for its kind) when the spec is larger than max_grammar_bytes, is not valid JSON /
        a valid JSON schema / regex / Lark grammar, or uses features llguidance cannot enforce.
        The compiled grammar is cached by a hash of (kind, spec), so the engine reuses it.

    grammar_for(guided) -> str: the llguidance grammar for a constraint (cached, validated).

Engines use engine.guided.matcher: GuidedFactory(model_dir, vocab_size, eos_ids).matcher(guided)
gives a RowMatcher per request (a deep copy of one cached LLMatcher per (kind, spec), its first
mask already computed: llguidance builds its lexer there, which a few hostile bytes make take
seconds, so the built-in engine calls it on a worker thread, engine/builtin/core_guided.py, never
in a step), which the engine feeds its output tokens (sync, idempotent) and asks for a token
bitmask each step (fill_bitmask, apply_bitmask: one op for the batch, on CPU or CUDA).
"""

from trtllm_gateway.engine.guided.compile import DEFAULT_PARAMS, check_guided, grammar_for

__all__ = ["DEFAULT_PARAMS", "check_guided", "grammar_for"]
