"""--engine-process / --no-engine-process pick where the one engine core runs (nothing started),
and a core process gets its engine config only: the pickled factory holds no secret of the
HTTP side."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from tests.configs import resolve_args
from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.core import EngineCore
from trtllm_gateway.engine.builtin.core_launch import build_core
from trtllm_gateway.engine.factory import create_engine
from trtllm_gateway.engine.transport.client import CoreClient
from trtllm_gateway.engine.transport.inproc import ThreadLauncher
from trtllm_gateway.engine.transport.process import ProcessLauncher

SECRETS = ("--api-key", "sk-client", "--internal-api-key", "int-secret")
CORS = ("--allowed-origins", "https://cors.example", "--allowed-headers", "X-Cors-Header")


def test_flag_picks_the_core_client() -> None:
    on = resolve_args("--engine-process")
    off = resolve_args("--no-engine-process")
    assert on.engine.engine_process and not off.engine.engine_process
    engine = create_engine(on)
    assert isinstance(engine, CoreClient)
    assert isinstance(engine.launcher, ProcessLauncher)
    assert engine.health().state == "loading"
    threaded = create_engine(off)  # the same client and core; the loop in a thread
    assert isinstance(threaded, CoreClient) and isinstance(threaded.launcher, ThreadLauncher)


def _factory_bytes(*argv: str) -> tuple[bytes, ProcessLauncher]:
    engine = create_engine(resolve_args("--served-model-name", "m", "--log-level", "debug", *argv))
    assert isinstance(engine, CoreClient) and engine.info.model_id == "m"
    launcher = engine.launcher
    assert isinstance(launcher, ProcessLauncher) and launcher.log_level == "debug"
    return pickle.dumps(launcher.factory), launcher


def test_the_core_process_gets_no_keys_and_no_cors() -> None:
    payload, launcher = _factory_bytes(*SECRETS, *CORS)
    for secret in (b"sk-client", b"int-secret", b"cors.example", b"X-Cors-Header"):
        assert secret not in payload
    core_config = pickle.loads(payload).args[0]
    assert isinstance(core_config, BuiltinConfig)
    assert core_config.engine.served_model_name == "m" and core_config.encoders is None
    assert launcher.factory.func is build_core


def test_an_api_server_imports_no_core_module() -> None:
    """Creating the engine in an API server leaves torch and the core's module unimported: the
    core process imports them (each API server once did too, 2.7-4.4 s of a start here)."""
    code = (
        "import sys\n"
        "from tests.configs import resolve_args\n"
        "from trtllm_gateway.engine.factory import create_engine\n"
        "create_engine(resolve_args('--engine-process'))\n"
        "heavy = [m for m in ('torch', 'trtllm_gateway.engine.builtin.core', 'llguidance')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_factory_builds_the_core_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[BuiltinConfig] = []
    monkeypatch.setattr(EngineCore, "__init__", lambda self, config: built.append(config))
    payload, _ = _factory_bytes()
    core = pickle.loads(payload)()
    assert isinstance(core, EngineCore) and built and built[0].engine.served_model_name == "m"


def test_encode_siblings_get_the_internal_key() -> None:
    """--encode-url: the core's embedder calls the siblings, so their key goes with them (and
    it is the only secret that does; the client keys stay behind)."""
    payload, _ = _factory_bytes(*SECRETS, "--encode-url", "http://enc:1,http://enc:2")
    assert b"sk-client" not in payload
    encoders = pickle.loads(payload).args[0].encoders
    assert encoders is not None and encoders.urls == ("http://enc:1", "http://enc:2")
    assert encoders.internal_key is not None
    assert encoders.internal_key.get_secret_value() == "int-secret"
