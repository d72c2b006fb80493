"""KV-cache events for KV-aware routers: the numbered log both engines fill, and its publishers."""
