"""trtllm-gateway: an OpenAI-compatible server over TensorRT-LLM or a built-in PyTorch engine.

One package, its folders keeping their roles: app (process wiring), openai (the OpenAI serving
layer), tool_parsers and reasoning (reply parsers), internal_api (the sibling-facing /internal/
endpoints), engine (the engine protocol and both engines), multimodal (image loading), config
(settings and engine args).
"""

# Importing it changes nothing in the environment. It used to set OMP_WAIT_POLICY=PASSIVE there,
# which every process started after the import inherited: llama.cpp's server under bench.run ran
# about 3x slower at concurrency 1 for it (issue 36). The built-in engine now leaves OpenMP's
# waiting to libgomp's default (engine/builtin/cpu_threads.py says why and what it measured).
