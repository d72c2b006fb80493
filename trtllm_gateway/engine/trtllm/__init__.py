"""TensorRT-LLM adapter behind the Engine protocol; import engine.trtllm.engine lazily.

Nothing in this package imports `tensorrt_llm` at module import time: the gateway installs and
runs without it, and `--engine trtllm` fails at start-up with one line saying how to get it.
"""
