"""The wiring and process management, the composition root: the CLI (flags -> configs), create_app,
the lifespan, the server, drain, and the supervisor that runs the engine core and the API
servers."""
