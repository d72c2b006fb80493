"""Stand-in `tensorrt_llm.executor.utils`: the per-request error type."""


class RequestError(RuntimeError):
    """One request failed; the LLM keeps serving others."""
