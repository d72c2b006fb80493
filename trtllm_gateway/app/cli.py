"""The trtllm-gateway command: serve, config check FILE, config show, version."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtllm_gateway.config.gateway import GatewayConfig

USAGE = """usage: trtllm-gateway COMMAND [ARGS]

commands:
  serve [flags]        run the OpenAI-compatible server (serve --help lists the flags)
  config check FILE    validate an engine-args YAML file
  config show [flags]  print the effective configuration
  bench sweep [flags]  performance sweep over engine configs and concurrencies (docs/sweeps.md)
  version              print the version
"""


def serve(argv: list[str]) -> int:
    from pydantic import ValidationError

    from trtllm_gateway.config.settings import Settings
    from trtllm_gateway.engine.factory import preflight, prestarted_core
    from trtllm_gateway.engine.protocol import EngineError
    from trtllm_gateway.web.logs import configure_logging

    try:
        config = Settings(_cli_parse_args=argv).parts()  # the one place flags become configs
    except ValidationError as exc:
        sys.stderr.write(f"trtllm-gateway serve: invalid settings\n{exc}\n")
        return 2
    server = config.server
    configure_logging(server.log_level, server.log_format)
    try:
        preflight(config)  # e.g. --engine trtllm without TensorRT-LLM: one line, no traceback
    except (EngineError, ValueError) as exc:
        sys.stderr.write(f"trtllm-gateway serve: {exc}\n")
        return 1
    # The core process starts importing torch and the engine now, while the app's modules load.
    with prestarted_core(config):
        return _serve(config)


def _serve(config: GatewayConfig) -> int:
    from trtllm_gateway.app.api_server_count import resolve_api_servers
    from trtllm_gateway.app.main import create_app
    from trtllm_gateway.app.server import GatewayServer, uvicorn_config

    config = resolve_api_servers(config)
    if config.server.api_server_count != 1:
        from trtllm_gateway.app.supervisor import supervise

        return supervise(config)
    try:
        app = create_app(config)
    except (OSError, ValueError) as exc:  # an unreadable --api-key-file, a bad OTLP endpoint
        sys.stderr.write(f"trtllm-gateway serve: {exc}\n")
        return 2
    server = config.server
    GatewayServer(uvicorn_config(app, server), app.state.drain, server.startup_timeout).run()
    return 0


def _config(argv: list[str]) -> int:
    sub, rest = (argv[0], argv[1:]) if argv else ("", [])
    if sub == "check":
        from trtllm_gateway.config.check import main_check

        return main_check(rest)
    if sub == "show":
        from trtllm_gateway.config.check import main_show

        return main_show(rest)
    sys.stderr.write("usage: trtllm-gateway config {check FILE | show [flags]}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # No command (the container's `python -m trtllm_gateway`) means serve, configured from
    # GATEWAY_* env.
    command, rest = (args[0], args[1:]) if args else ("serve", [])
    if command == "serve":
        return serve(rest)
    if command == "config":
        return _config(rest)
    if command == "bench" and rest[:1] == ["sweep"]:
        # bench/ is not an installed package: it is read from the repository root (the current
        # directory), which a console script does not put on sys.path by itself.
        sys.path.insert(0, os.getcwd())
        from bench.sweep import main as sweep_main

        return sweep_main(rest[1:])
    if command == "version":
        from trtllm_gateway.web.version import VERSION

        sys.stdout.write(f"trtllm-gateway {VERSION}\n")
        return 0
    if command in {"-h", "--help", "help"}:
        sys.stdout.write(USAGE)
        return 0
    sys.stderr.write(USAGE)
    return 2
