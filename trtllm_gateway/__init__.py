"""trtllm-gateway: an OpenAI-compatible server over TensorRT-LLM or a built-in PyTorch engine.

One package, its folders keeping their roles: app (process wiring), routers (HTTP), engine (the
engine protocol and both engines), multimodal (image loading), config (settings and engine args).
"""
