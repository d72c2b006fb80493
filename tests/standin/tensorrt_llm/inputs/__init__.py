"""Stand-in `tensorrt_llm.inputs`."""
