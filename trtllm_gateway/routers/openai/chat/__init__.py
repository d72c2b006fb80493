"""POST /v1/chat/completions: its route, request parse, reply parsing and chunk rendering."""
