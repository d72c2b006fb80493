"""Per-request constraint state for an engine: an llguidance LLMatcher fed the output tokens.

RowMatcher.sync(token_ids, prompt_len) feeds the matcher the output tokens it has not seen yet,
so it is idempotent: a preempted request that recomputes its KV, a decode-side request whose
first token a prefill sibling sampled, or a step that calls it twice all leave the matcher
exactly one token per output token. Until the output holds `start_after` (the end of the
reasoning) the matcher sees nothing and masks nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer

from trtllm_gateway.engine.guided.compile import DEFAULT_PARAMS, grammar_for
from trtllm_gateway.engine.protocol import GuidedDecoding, InvalidRequestError

_TEMPLATES = 128  # matchers kept per model, one per distinct constraint


class GuidedFactory:
    """Builds RowMatchers for one model; its LLTokenizer is made on first use (~1 s) and kept."""

    def __init__(self, model_dir: Path | None, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._tokenizer: LLTokenizer | None = None
        self._templates: OrderedDict[tuple[str, str], LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                if self.model_dir is None:
                    raise InvalidRequestError("guided decoding needs the model's tokenizer")
                import llguidance.hf  # imports transformers: at the first grammar, not the
                from transformers import PreTrainedTokenizerFast  # core's start (0.9 s there)

                hf = PreTrainedTokenizerFast.from_pretrained(
                    str(self.model_dir), local_files_only=True
                )
                self._tokenizer = llguidance.hf.from_tokenizer(
                    hf, n_vocab=self.vocab_size, eos_token=list(self.eos_ids) or None
                )
            return self._tokenizer

    def cached_matcher(self, guided: GuidedDecoding) -> RowMatcher | None:
        """A matcher at once when this constraint was built before, else None (then call
        matcher() off the step loop). Cheap enough for the step loop: a deep copy (~10 us) of
        a template kept only once its first mask worked, so the lexer the copy shares is
        already built (a bomb's second request: 1 ms, its first: 0.5-2 s)."""
        with self._lock:
            template = self._templates.get((guided.kind, guided.spec))
        return None if template is None else RowMatcher(template.deep_copy(), guided.start_after)

    def matcher(self, guided: GuidedDecoding) -> RowMatcher:
        """A fresh matcher for one request, its first mask already computed; call off the
        event loop and the step thread (engine/builtin/core_guided.py).

        Built once per (kind, spec) and kept untouched as a template (~1 ms for a schema,
        more for big ones); each request gets a deep copy (~10 us). llguidance builds its
        lexer lazily, on the first mask: a few bytes of regex (`a{1000000}`) cost seconds
        there, so the first mask is computed here and never in a step. The copies share the
        lexer the first one built, and later steps are bounded by llguidance's per-step
        limits (step_lexer_fuel, step_max_items).
        """
        key = (guided.kind, guided.spec)
        param = DEFAULT_PARAMS[guided.kind]
        with self._lock:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
        cached = template is not None
        if template is None:
            template = LLMatcher(self.tokenizer(), grammar_for(guided), log_level=0)
            if template.is_error():
                raise InvalidRequestError(
                    f"constraint failed to start: {template.get_error()}", param=param
                )
            # The lexer's build, on a copy thrown away: the copy that computed it pays again
            # on its next mask (0.1 s for `a{1000000}`), a fresh one does not (0.1 ms).
            probe = RowMatcher(template.deep_copy(), guided.start_after)
            fill_bitmask([probe], self.vocab_size, pin=False)
            if probe.error is not None:
                raise InvalidRequestError(f"constraint failed to start: {probe.error}", param=param)
        row = RowMatcher(template.deep_copy(), guided.start_after)
        fill_bitmask([row], self.vocab_size, pin=False)  # so the step's first mask is cached
        if row.error is not None:
            raise InvalidRequestError(f"constraint failed to start: {row.error}", param=param)
        if not cached:  # kept only once its first mask worked
            with self._lock:
                self._templates[key] = template
                while len(self._templates) > _TEMPLATES:
                    self._templates.popitem(last=False)
        return row


class RowMatcher:
    def __init__(self, matcher: LLMatcher, start_after: tuple[int, ...] = ()) -> None:
        self.m = matcher
        self.start_after = list(start_after)
        self.active = not start_after
        self.seen = 0  # output tokens already handled
        self._raised: str | None = None

    def sync(self, token_ids: list[int], prompt_len: int) -> None:
        """Feed the output tokens not yet seen (all of them real ids, no placeholders)."""
        end = len(token_ids)
        i = prompt_len + self.seen
        if i >= end:
            return
        self.seen = end - prompt_len
        if not self.active:
            n = len(self.start_after)
            # The first output position at which start_after could end, among the new tokens.
            for j in range(max(i, prompt_len + n - 1), end):
                if token_ids[j - n + 1 : j + 1] == self.start_after:
                    self.active, i = True, j + 1
                    break
            else:
                return
        if i < end and not self.m.is_error() and self._raised is None:
            try:
                self.m.consume_tokens(token_ids[i:end])
            except (OverflowError, ValueError, TypeError) as e:  # e.g. a negative id
                self._raised = f"bad token in the output: {e}"

    @property
    def error(self) -> str | None:
        """The matcher's error, first line only (it appends a state dump), or None."""
        if self._raised is not None:
            return self._raised
        if not self.m.is_error():
            return None
        return (self.m.get_error().strip().splitlines() or ["constraint failed"])[0]

    @property
    def done(self) -> bool:
        """The grammar is complete and takes nothing more (EOS only)."""
        return self.active and self.m.is_stopped() and self.error is None

    @property
    def masking(self) -> bool:
        return self.active and self.error is None


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def fill_bitmask(rows: list[RowMatcher], vocab_size: int, pin: bool) -> torch.Tensor:
    """[len(rows), ceil(vocab/32)] int32 allowed-token bits of each matcher, on the host."""
    mask = torch.empty((len(rows), bitmask_width(vocab_size)), dtype=torch.int32, pin_memory=pin)
    nbytes = mask.shape[1] * 4
    for i, row in enumerate(rows):
        row.m.unsafe_compute_mask_ptr(mask[i].data_ptr(), nbytes)
    return mask


_BITS: dict[torch.device, torch.Tensor] = {}
# Byte value -> its 8 bits (least significant first) as an additive bias: 0 allowed, -inf not.
_BYTE_BIAS = torch.from_numpy(
    np.where(
        np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") == 1,
        np.float32(0.0),
        np.float32(-np.inf),
    ).astype(np.float32)
)


def apply_bitmask(logits: torch.Tensor, mask: torch.Tensor, rows: list[int] | None = None) -> None:
    """Set every disallowed token to -inf, in place: logits [R, V] float32; mask [K, W], one row
    per entry of `rows` (the logits rows it applies to), or per logits row when rows is None.

    CPU: a 256-entry byte table turns the mask into an additive bias (1.6 ms for 32 rows of a
    49k vocabulary, against 32 ms for a shift-and-mask over [K, W, 32] int32 and 3 ms for a
    boolean masked_fill). CUDA: the mask goes up in one copy and is unpacked on the device.
    """
    vocab, dev = logits.shape[1], logits.device
    if dev.type == "cpu":
        bias = _BYTE_BIAS[mask.view(torch.uint8).long()].view(mask.shape[0], -1)[:, :vocab]
        if rows is None:
            logits.add_(bias)
        else:
            idx = torch.tensor(rows, dtype=torch.long)
            logits.index_copy_(0, idx, logits.index_select(0, idx).add_(bias))
        return
    shifts = _BITS.get(dev)
    if shifts is None:
        shifts = _BITS[dev] = torch.arange(32, dtype=torch.int32, device=dev)
    m = mask.to(dev, non_blocking=True)
    banned = ((m.unsqueeze(-1) >> shifts) & 1).view(m.shape[0], -1)[:, :vocab] == 0
    if rows is None:
        logits.masked_fill_(banned, float("-inf"))
        return
    idx = torch.tensor(rows, dtype=torch.long).to(dev, non_blocking=True)
    logits.index_copy_(0, idx, logits.index_select(0, idx).masked_fill_(banned, float("-inf")))
