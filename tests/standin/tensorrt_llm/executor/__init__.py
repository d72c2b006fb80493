"""Stand-in `tensorrt_llm.executor`."""

from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.result import CompletionOutput, Logprob
from tensorrt_llm.executor.utils import RequestError

__all__ = ["CompletionOutput", "LoRARequest", "Logprob", "RequestError"]
