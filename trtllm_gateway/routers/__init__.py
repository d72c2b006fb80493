"""routers package."""
