"""builtin package."""
