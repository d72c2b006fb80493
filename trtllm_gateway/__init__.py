"""trtllm-gateway: an OpenAI-compatible server over TensorRT-LLM or a built-in PyTorch engine.

One package, its folders keeping their roles: app (process wiring), openai (the OpenAI serving
layer), tool_parsers and reasoning (reply parsers), internal_api (the sibling-facing /internal/
endpoints), engine (the engine protocol and both engines), multimodal (image loading), config
(settings and engine args).
"""
