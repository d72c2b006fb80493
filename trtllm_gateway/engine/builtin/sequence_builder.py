"""SequenceBuilder: a GenerateRequest checked against the engine's limits, turned into a Sequence.

What EngineCore refuses at admission and how it builds a Sequence: the prompt and max_tokens
against the context and the KV cache, the token ids against the vocabulary, each request's seeded
generator, and a decode-side request's sibling KV and first token. The core itself checks
in-flight ids and images.
"""

from __future__ import annotations

import random
import time

import torch

from trtllm_gateway.engine.builtin.block_manager import BlockManager
from trtllm_gateway.engine.builtin.sequence import Sequence
from trtllm_gateway.engine.disagg import kv_wire
from trtllm_gateway.engine.disagg.kv_check import check_region
from trtllm_gateway.engine.disagg.kv_transport import KV_REFUSED
from trtllm_gateway.engine.kv_region import KvRegion
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    EngineInfo,
    GenerateRequest,
    InvalidRequestError,
    TokenEvent,
    TokenLogprob,
    check_token_ids,
)


class SequenceBuilder:
    def __init__(
        self, info: EngineInfo, blocks: BlockManager, device: torch.device, seed: int
    ) -> None:
        self.info = info
        self.blocks = blocks
        self.device = device
        self._rng = random.Random(seed)  # a request without a seed draws its own from here

    def build(self, req: GenerateRequest) -> Sequence:
        """The request's Sequence, or the EngineError that says why it can never run."""
        info, blocks = self.info, self.blocks
        n, sp = len(req.prompt_token_ids), req.sampling
        if n == 0:
            raise InvalidRequestError("the prompt is empty")
        if n + sp.max_tokens > info.max_model_len:
            raise ContextTooLongError(n, sp.max_tokens, info.max_model_len)
        check_request_ids(req, info.vocab_size)
        if blocks.blocks_needed(n + sp.max_tokens) > blocks.num_blocks:
            raise InvalidRequestError(
                f"prompt ({n}) plus max_tokens ({sp.max_tokens}) needs more KV cache than the "
                f"engine has ({blocks.num_blocks * blocks.block_size} tokens)"
            )
        seed = sp.seed if sp.seed is not None else self._rng.getrandbits(63)
        return Sequence.from_request(req, torch.Generator(device=self.device).manual_seed(seed))

    def import_first(
        self,
        seq: Sequence,
        first_token_ids: tuple[int, ...],
        first_logprobs: tuple[TokenLogprob, ...] | None,
        region: KvRegion | None,
    ) -> TokenEvent:
        """A decode-side request: check the sibling's KV region against the prompt and our
        layout (its bytes are checked where the transfer worker copies them); its first
        token(s) as an event."""
        if region is None or not first_token_ids:
            raise InvalidRequestError("generation_only needs the sibling's KV and first token")
        if not all(0 <= t < self.info.vocab_size for t in first_token_ids):
            raise InvalidRequestError("the sibling's first token ids are out of the vocabulary")
        try:
            check_region(region, self.info.kv_layout, seq.prompt_len)
        except kv_wire.KvWireError as e:
            raise InvalidRequestError(f"{KV_REFUSED}: {e}") from e
        seq.token_ids += first_token_ids
        seq.first_token = time.perf_counter()
        return TokenEvent(first_token_ids, first_logprobs)


def check_request_ids(req: GenerateRequest, vocab: int) -> None:
    """Every id the request gives in [0, vocab), allowed_token_ids not empty, logprob widths
    within the vocabulary: InvalidRequestError naming the field.

    The engine's own door, for callers that skip the HTTP routes' checks (a sibling's prefill, a
    CoreClient used directly); past it the step takes the ids as valid and checks none again.
    """
    sp = req.sampling
    check_token_ids(req.prompt_token_ids, vocab, "prompt")
    check_token_ids(sp.stop_token_ids, vocab, "stop_token_ids")
    check_token_ids((t for t, _ in sp.logit_bias), vocab, "logit_bias")
    if sp.allowed_token_ids is not None and not sp.allowed_token_ids:
        raise InvalidRequestError("allowed_token_ids is empty", param="allowed_token_ids")
    check_token_ids(sp.allowed_token_ids or (), vocab, "allowed_token_ids")
    # A top-k wider than the vocabulary fails torch.topk inside the step (prompt logprobs are
    # computed in the forward pass, where a failure is the whole step's).
    for param, k in (("logprobs", sp.logprobs), ("prompt_logprobs", sp.prompt_logprobs)):
        if k is not None and not 0 <= k <= vocab:
            raise InvalidRequestError(f"{param} must be in [0, {vocab}], got {k}", param=param)


def region_of_blob(blob: bytes) -> tuple[KvRegion, memoryview]:
    """A kv_wire blob (an old sibling's, checked by the API server that pulled it) as a "frame"
    region and its payload. Raises InvalidRequestError."""
    try:
        header, data = kv_wire.decode(blob, verify=False)
    except kv_wire.KvWireError as e:
        raise InvalidRequestError(f"remote prefill KV refused: {e}") from e
    region = KvRegion(
        transport="frame", arena="", offset=0, nbytes=len(data), shape=header.shape,
        dtype=header.dtype, kv_layout=header.kv_layout,
    )  # fmt: skip
    return region, data
