"""The sibling-facing /internal/ endpoints (remote prefill, image encode, KV events): served to
other gateway instances and KV-aware routers, never to clients; not OpenAI serving."""
