"""The stand-in's logits post-processors: TensorRT-LLM 1.2's PyTorch-backend hook, as called.

Reproduces, from NVIDIA/TensorRT-LLM (1.2 period):
- tensorrt_llm/executor/worker.py (GenerationExecutorWorker._enqueue_request): on the PyTorch
  backend `sampling_params.logits_processor` (one callable or a list) becomes the request's
  `py_logits_post_processors` list, "a dynamic Python attribute ... since the latter will cause
  PyCapsule pickling issues": the callables cross to the executor worker by pickle, so the
  stand-in round-trips them through pickle at submission (an unpicklable processor fails there,
  and the worker's copy, not the caller's object, holds any state).
- tensorrt_llm/_torch/pyexecutor/model_engine.py (PyTorchModelEngine.
  _execute_logit_post_processors): after the forward pass, for each request holding processors,
  `assert 4 <= len(inspect.signature(lp).parameters) <= 5`, then
  `lp(request.py_request_id, logits_row.view(1, 1, -1), [request.get_tokens(0)], None, None)`:
  the int request id, the row as a [1, 1, vocab] view to modify in place, the prompt plus the
  output so far as one beam, no stream, no client id.
- tensorrt_llm/_torch/pyexecutor/py_executor.py (PyExecutor._handle_errors): an exception in
  the forward step fails every active request with its message.

The scripted model's logits are one-hot-like (its chosen token 10, the rest 0); the sampler
takes the argmax after the processors ran, then embedding_bias and the guide apply as before.
"""

from __future__ import annotations

import inspect
import pickle
from typing import Any


def to_worker(logits_processor: Any) -> list[Any]:
    """What the executor worker holds: a list, each callable a pickled copy."""
    if not logits_processor:
        return []
    procs = logits_processor if isinstance(logits_processor, list) else [logits_processor]
    return [pickle.loads(pickle.dumps(lp)) for lp in procs]


def post_process(
    procs: list[Any], request_id: int, token: int, token_ids: list[int], vocab: int
) -> int:
    """The token after the processors edited the scripted step's logits row."""
    import torch

    row = torch.zeros(vocab, dtype=torch.float32)
    row[token] = 10.0
    for lp in procs:
        params = inspect.signature(lp).parameters
        assert 4 <= len(params) <= 5, (
            "Logit post processor signature must match the `LogitsProcessor` interface "
            "defined in `tensorrtllm.sampling_params`."
        )
        lp(request_id, row.view(1, 1, -1), [list(token_ids)], None, None)
    return int(row.argmax())
