"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API): a translator onto
chat's parse, run and render."""
