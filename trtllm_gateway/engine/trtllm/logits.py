"""Logits processors on TensorRT-LLM: our processors behind its per-request logits hook.

TensorRT-LLM 1.2 takes `SamplingParams.logits_processor`, a callable with the signature of
`tensorrt_llm.sampling_params.LogitsProcessor.__call__(req_id, logits, token_ids, stream_ptr,
client_id)` that modifies `logits` in place. On the PyTorch backend the executor worker
(executor/base_worker.py, _enqueue_request) moves it to the request as
`py_logits_post_processors`, pickled across to the worker, and
PyTorchModelEngine._execute_logit_post_processors (_torch/pyexecutor/model_engine.py) calls it
after each forward pass: it asserts the callable takes 4 or 5 parameters, passes the request's
row as a [1, 1, vocab] view, `token_ids` as [prompt + output so far] (one beam), and None for
the stream and the client id. A context request is called only on its last prompt chunk.

So on this engine `apply` sees one row per call, and the processor travels pickled with each
request. An exception escaping the hook would fail every request of the step
(PyExecutor._handle_errors), so the hook logs it and leaves the logits alone, as NVIDIA Dynamo's
TrtllmDynamoLogitsAdapter does; the built-in engine fails just the one request instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trtllm_gateway.engine.logits.load import Bound, LogitsProcessors, apply_bound, args_of
from trtllm_gateway.engine.logits.processor import ProcessorContext
from trtllm_gateway.engine.protocol import EngineInfo, GenerateRequest

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from trtllm_gateway.config.engine import EngineConfig

logger = logging.getLogger(__name__)


class TrtllmLogitsHook:
    """One request's bound processors, called by TensorRT-LLM as its logits post-processor."""

    def __init__(self, bound: tuple[Bound, ...], prompt_len: int) -> None:
        self.bound = bound
        self.prompt_len = prompt_len

    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: list[list[int]],
        stream_ptr: int | None,
        client_id: int | None = None,
    ) -> None:
        if len(token_ids) != 1:
            logger.error(
                "logits processors: request %s has %d beams; skipped", req_id, len(token_ids)
            )
            return
        if stream_ptr is None:  # the PyTorch backend: its own stream is current
            self._apply(req_id, logits, token_ids[0])
            return
        import torch  # the TensorRT backend names the stream the logits live on

        with torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr)):  # type: ignore[no-untyped-call]
            self._apply(req_id, logits, token_ids[0])

    def _apply(self, req_id: int, logits: torch.Tensor, token_ids: list[int]) -> None:
        rows = logits.view(-1, logits.shape[-1])  # [1, vocab], a view: changes reach TensorRT-LLM
        before = rows.clone()
        failed = apply_bound(rows, [(self.bound, token_ids, self.prompt_len)])
        if failed:
            rows.copy_(before)
            logger.error("request %s: %s; its logits are left as they were", req_id, failed[0])


def create_processors(
    engine: EngineConfig, info: EngineInfo, tokenizer_dir: Path
) -> LogitsProcessors:
    context = ProcessorContext(info.vocab_size, info.eos_token_ids, str(tokenizer_dir), "cuda")
    return LogitsProcessors.create(
        engine.logits_processor, context, engine.enable_test_logits_processor
    )


def attach(sp: Any, processors: LogitsProcessors, req: GenerateRequest) -> Any:
    """Put the request's hook on `tensorrt_llm.SamplingParams` when a processor holds it."""
    if processors:
        bound = processors.bind(req.prompt_token_ids, args_of(req.sampling))
        if bound:
            sp.logits_processor = TrtllmLogitsHook(bound, len(req.prompt_token_ids))
    return sp
