"""Chat templating, tokenization and incremental detokenization, once for every engine.

Wraps a Hugging Face fast tokenizer loaded from a local directory (never the hub). Routers and
engines share these token ids; logprob token strings and bytes come from here too.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from trtllm_gateway.engine.protocol import InvalidRequestError

# vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET: prompt tokens kept as decoding context so the
# first generated token keeps its leading space on SentencePiece tokenizers.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in character -> its raw byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


ContentFormat = Literal["string", "openai"]
# A template that iterates a message's content (vLLM detects the same from the Jinja AST).
_ITERATES_CONTENT = re.compile(
    r"for\s+\w+\s+in\s+\w+(\[['\"]content['\"]\]|\.content)|"
    r"\w+(\[['\"]content['\"]\]|\.content)\s*\|\s*selectattr"
)


def content_format(chat_template: str) -> ContentFormat:
    return "openai" if _ITERATES_CONTENT.search(chat_template) else "string"


class Tokenizer:
    """A loaded tokenizer plus the model's chat template."""

    def __init__(self, hf: Any) -> None:
        self._hf = hf
        decoder = json.loads(hf.backend_tokenizer.to_str()).get("decoder") or {}
        self._byte_level = "ByteLevel" in json.dumps(decoder)
        self._special_ids = frozenset(hf.all_special_ids)
        self.vocab_size: int = len(hf)
        # transformers' decode is the Rust decode plus optional space clean-up and a layer of
        # Python argument handling; without clean-up the Rust call alone gives the same text at a
        # fraction of the cost, which matters on the per-token streaming path.
        self._backend = hf.backend_tokenizer
        self._rust_decode = not getattr(hf, "clean_up_tokenization_spaces", False)

    @staticmethod
    def warm_imports() -> None:
        """Import what from_dir needs (transformers, ~0.8 s): a server does it in a thread while
        its engine loads, so the tokenizer is ready that much sooner after the engine."""
        import jinja2  # noqa: F401
        from transformers import PreTrainedTokenizerFast  # noqa: F401

    @classmethod
    def from_dir(cls, path: str | Path, chat_template: str | None = None) -> Tokenizer:
        """Load tokenizer.json (and the chat template) from a local model directory;
        `chat_template` (Jinja text, or a file holding it) replaces the model's own."""
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        if chat_template:
            hf.chat_template = load_chat_template(chat_template)
        return cls(hf)

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's own EOS; engines report the authoritative list in EngineInfo."""
        eos = getattr(self._hf, "eos_token_id", None)
        return None if eos is None else int(eos)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._hf, "chat_template", None))

    @property
    def chat_template(self) -> str:
        """The template's Jinja text ("" when none); a dict of named templates, joined."""
        template = getattr(self._hf, "chat_template", None) or ""
        return "\n".join(template.values()) if isinstance(template, dict) else str(template)

    @property
    def image_token(self) -> str | None:
        """The text of the image placeholder token (LLaVA: "<image>"), if the vocab has one."""
        token = getattr(self._hf, "image_token", None) or "<image>"
        found = self._hf.convert_tokens_to_ids(token)
        return str(token) if isinstance(found, int) and found != self._hf.unk_token_id else None

    @property
    def content_format(self) -> ContentFormat:
        """How the chat template wants message content: "openai" (a list of typed parts,
        images as {"type": "image"}) when it loops over the content, else "string"."""
        return content_format(str(getattr(self._hf, "chat_template", None) or ""))

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Render messages with the model's own chat template and tokenize the result."""
        if not self.has_chat_template:
            raise InvalidRequestError("This model has no chat template; use /v1/completions.")
        from jinja2 import TemplateError

        reserved = sorted(set(chat_template_kwargs or ()) & self._reserved_template_kwargs)
        if reserved:
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {', '.join(reserved)}: the gateway sets "
                "the chat template's own arguments.",
                param="chat_template_kwargs",
            )
        try:
            ids = self._hf.apply_chat_template(
                [dict(m) for m in messages],
                tools=[dict(t) for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                return_dict=False,
                **dict(chat_template_kwargs or {}),
            )
        except (TemplateError, TypeError, ValueError) as exc:
            # A template fed a kwarg of the wrong shape fails inside Jinja with a Python error.
            raise InvalidRequestError(f"Chat template error: {exc}") from exc
        return [int(i) for i in ids]

    @functools.cached_property
    def _reserved_template_kwargs(self) -> frozenset[str]:
        """apply_chat_template's own named arguments (tokenize, return_dict, conversation, ...)
        and the template's `messages`: a chat_template_kwargs entry would override the gateway's
        (or collide with them, a TypeError)."""
        import inspect

        params = inspect.signature(self._hf.apply_chat_template).parameters.values()
        named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}
        return frozenset(named | {"messages"})

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(i) for i in self._hf.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids, skip = list(token_ids), skip_special_tokens
        if self._rust_decode:
            return str(self._backend.decode(ids, skip_special_tokens=skip))
        return str(self._hf.decode(ids, skip_special_tokens=skip))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one Tokenizer lives for the process
    def token_text(self, token_id: int) -> str:
        """The token decoded on its own (partial UTF-8 shows as U+FFFD), for logprobs."""
        return str(self._hf.decode([token_id], skip_special_tokens=False))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one Tokenizer lives for the process
    def token_bytes(self, token_id: int) -> bytes:
        """The token's raw bytes; byte-level BPE tokens may be partial UTF-8 sequences."""
        piece = self._hf.convert_ids_to_tokens(token_id)
        if isinstance(piece, str) and token_id not in self._special_ids:
            if self._byte_level:
                table = _byte_level_decoder()
                if all(ch in table for ch in piece):
                    return bytes(table[ch] for ch in piece)
            elif match := _BYTE_TOKEN.match(piece):
                return bytes([int(match.group(1), 16)])
        return self.token_text(token_id).encode("utf-8")

    def detokenizer(
        self, prompt_token_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, prompt_token_ids, skip_special_tokens)


def load_chat_template(value: str) -> str:
    """--chat-template: a file's Jinja text, or the text itself (it has template tags)."""
    if "{" not in value and Path(value).is_file():
        return Path(value).read_text()
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor Jinja text")
    return value


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas, never splitting a multi-byte character.

    vLLM's prefix/read offsets: decode a small window twice (with and without the new tokens) and
    emit the difference only when it does not end in U+FFFD, i.e. the last character is complete.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._tokens: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._prefix_text: str | None = None

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the newly completed text (possibly empty)."""
        if not token_ids:
            return ""
        self._tokens.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Text held back at the end of the stream (an incomplete character shows as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset >= len(self._tokens):
            return ""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._tokens))
        if len(new_text) <= len(self._prefix_text) and not final:
            return ""
        if new_text.endswith(_REPLACEMENT) and not final:
            return ""
        delta = new_text[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        self._prefix_text = None
        return delta

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._tokens[start:end], self._skip_special)
