"""The OpenAI serving layer: /v1/chat/completions, /v1/completions, /v1/models and the
serving pieces they share (schemas, sampling checks, structured outputs, fan-out, SSE)."""
