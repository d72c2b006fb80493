"""The seeds' test processor: every request it holds answers "Hello world!", then ends.

NVIDIA Dynamo ships it as HelloWorldLogitsProcessor (lib/bindings/python/src/dynamo/
logits_processing/examples/hello_world.py) and its TensorRT-LLM handler puts it on every request
when DYNAMO_ENABLE_TEST_LOGITS_PROCESSOR=1; here GATEWAY_ENABLE_TEST_LOGITS_PROCESSOR=1 does
that, and loaded by path (`--logits-processor trtllm_gateway.engine.logits.hello_world:
HelloWorldLogitsProcessor`) it holds the requests whose vllm_xargs set "hello_world".

As there, the response's tokens are the tokenizer's encoding of the text without special tokens
and the end is the tokenizer's eos_token_id; at each step every other token is masked to -inf.
Unlike there, the position comes from the output so far rather than a counter, so a decode
instance continues what its prefill sibling began.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trtllm_gateway.engine.logits.processor import (
    ExtraArgs,
    LogitsProcessor,
    ProcessorContext,
    Row,
)

RESPONSE = "Hello world!"
ARG = "hello_world"


class HelloWorldLogitsProcessor(LogitsProcessor[tuple[int, ...]]):
    def __init__(self, context: ProcessorContext, every_request: bool = False) -> None:
        super().__init__(context)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(context.tokenizer_dir, local_files_only=True)
        eos = tokenizer.eos_token_id
        if eos is None:
            eos = context.eos_token_ids[0]
        self.script = (*tokenizer.encode(RESPONSE, add_special_tokens=False), int(eos))
        self.every_request = every_request

    def new_state(self, prompt_token_ids: Sequence[int], args: ExtraArgs) -> tuple[int, ...] | None:
        return self.script if self.every_request or args.get(ARG) else None

    def apply(self, logits: torch.Tensor, rows: Sequence[Row[tuple[int, ...]]]) -> None:
        wanted = [r.state[min(len(r.output_ids), len(r.state) - 1)] for r in rows]
        index = torch.tensor(wanted, dtype=torch.long, device=logits.device).unsqueeze(1)
        mask = torch.full_like(logits, float("-inf")).scatter_(1, index, 0.0)
        logits.add_(mask)
