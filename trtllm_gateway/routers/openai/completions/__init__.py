"""POST /v1/completions: its route, prompt parse and chunk rendering."""
