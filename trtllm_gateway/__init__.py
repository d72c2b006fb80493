"""trtllm-gateway: an OpenAI-compatible server over TensorRT-LLM or a built-in PyTorch engine.

One package, its folders keeping their roles: app (process wiring), openai (the OpenAI serving
layer), tool_parsers and reasoning (reply parsers), internal_api (the sibling-facing /internal/
endpoints), engine (the engine protocol and both engines), multimodal (image loading), config
(settings and engine args). Importing it changes nothing in the process's environment: the
OpenMP policy the built-in engine wants is given to torch as it loads, in the process that runs
the engine (engine/builtin/openmp_env.py).
"""
