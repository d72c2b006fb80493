"""config/settings.py from the gateway's side, and the CLI dispatch in app/cli.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtllm_gateway.app import cli
from trtllm_gateway.config.settings import Settings


def test_kebab_case_flags() -> None:
    s = Settings(
        _cli_parse_args=[
            "--served-model-name", "m", "--max-model-len", "128", "--engine", "trtllm",
            "--no-enable-prefix-caching", "--shutdown-timeout", "5",
        ]
    )  # fmt: skip
    assert s.served_model_name == "m"
    assert s.max_model_len == 128
    assert s.engine == "trtllm"
    assert s.enable_prefix_caching is False
    assert s.shutdown_timeout == 5.0


def test_env_and_flag_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_PORT", "9001")
    monkeypatch.setenv("GATEWAY_MAX_LOGPROBS", "5")
    assert Settings().port == 9001
    assert Settings().max_logprobs == 5
    assert Settings(_cli_parse_args=["--port", "9002"]).port == 9002


def test_bad_flags() -> None:
    with pytest.raises(SystemExit):
        Settings(_cli_parse_args=["--no-such-flag", "1"])
    with pytest.raises(ValidationError, match="max_logprobs"):
        Settings(_cli_parse_args=["--max-logprobs", "50"])


def test_serve_reports_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--port", "-5"]) == 2
    assert "port" in capsys.readouterr().err


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(ValueError, match="frozen"):
        s.port = 1  # type: ignore[misc]


def test_cli_dispatch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert "trtllm-gateway" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0
    assert cli.main(["bogus"]) == 2
    assert cli.main(["config"]) == 2


@pytest.mark.parametrize(
    "conflict", [{"dtype": "bfloat16"}, {"quantization": "int8"}, {"device": "cuda"}]
)
def test_int8_activations_conflicts_are_errors(conflict: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="--packed-weights int8 is for the CPU path"):
        Settings(packed_weights="int8", **conflict)  # type: ignore[arg-type]
    assert Settings(packed_weights="int8", device="cpu").packed_weights == "int8"


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--engine", "trtllm"], "needs --engine builtin with its core process"),
        (["--no-engine-process"], "needs --engine builtin with its core process"),
        (["--mode", "encode"], "does not run --mode encode"),
        (["--kv-events-zmq", "tcp://*:5557"], "cannot publish --kv-events-zmq"),
    ],
)
def test_api_server_count_refuses_what_servers_cannot_share(flags: list[str], error: str) -> None:
    assert Settings().api_server_count is None  # auto: app/api_server_count.py
    assert (
        Settings(_cli_parse_args=["--api-server-count", "4"]).parts().server.api_server_count == 4
    )
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        Settings(_cli_parse_args=["--api-server-count", "0"])
    with pytest.raises(ValidationError, match=error):
        Settings(_cli_parse_args=["--api-server-count", "2", *flags])
