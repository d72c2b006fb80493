"""trtllm-gateway: an OpenAI-compatible server over TensorRT-LLM or a built-in PyTorch engine.

One package, a folder a layer, top down: app (wiring and process management, the composition
root), routers (the endpoints: openai/, anthropic/, internal/ for siblings, health), web (the
HTTP kit the endpoints stand on), multimodal (image loading), reasoning and tool_parsers (reply
parsers), engine (the engine protocol, the transport to the core, both engines), config
(settings and engine args). pyproject.toml's import-linter contracts hold the order.
"""

# Importing it changes nothing in the environment. It used to set OMP_WAIT_POLICY=PASSIVE there,
# which every process started after the import inherited: llama.cpp's server under bench.run ran
# about 3x slower at concurrency 1 for it (issue 36). The built-in engine now leaves OpenMP's
# waiting to libgomp's default (engine/builtin/cpu_threads.py says why and what it measured).
