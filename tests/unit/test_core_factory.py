"""--engine-process / --no-engine-process pick where the one engine core runs (nothing started)."""

from __future__ import annotations

from trtllm_gateway.config.settings import Settings
from trtllm_gateway.engine.builtin.config import engine_settings
from trtllm_gateway.engine.core.client import CoreClient
from trtllm_gateway.engine.core.inproc import ThreadLauncher
from trtllm_gateway.engine.core.process import ProcessLauncher
from trtllm_gateway.engine.factory import create_engine


def test_flag_picks_the_core_client() -> None:
    on = Settings(_cli_parse_args=["--engine-process"])
    off = Settings(_cli_parse_args=["--no-engine-process"])
    assert on.engine_process and not off.engine_process
    engine = create_engine(on)
    assert isinstance(engine, CoreClient)
    assert isinstance(engine.launcher, ProcessLauncher)
    assert engine.health().state == "loading"
    threaded = create_engine(off)  # the same client and core; the loop in a thread
    assert isinstance(threaded, CoreClient) and isinstance(threaded.launcher, ThreadLauncher)


def test_the_core_never_gets_the_api_keys() -> None:
    settings = Settings(api_key=["sk-secret"], served_model_name="m")
    core = engine_settings(settings)
    assert core.api_key == [] and core.api_key_file is None
    assert core.served_model_name == "m"
    engine = create_engine(settings.model_copy(update={"engine_process": True}))
    assert isinstance(engine, CoreClient) and engine.info.model_id == "m"
    assert isinstance(engine.launcher, ProcessLauncher)
    assert engine.launcher.settings.api_key == []
