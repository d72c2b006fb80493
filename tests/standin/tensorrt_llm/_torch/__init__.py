"""Stand-in `tensorrt_llm._torch`."""
