"""EPD on TensorRT-LLM end to end over the stand-in (tests/standin): a real `--engine trtllm
--mode encode` server and an aggregated `--engine trtllm --encode-url` server, the openai SDK as
client (issue 21 item 8). The stand-in has no GPU: this proves the gateway's paths (start-up,
the sibling endpoint, the embeddings fed back), not TensorRT-LLM's kernels.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.ops_client import INTERNAL_KEY
from tests.e2e.server import Server
from tests.engine.tiny_llava import build_tiny_llava, sample_images
from tests.standin import standin_env

INTERNAL = ["--internal-api-key", INTERNAL_KEY]  # the encoder's /internal/ takes only it


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("trtllm-epd"), "llava_next")


@pytest.fixture(scope="module")
def encoder(llava: Path, log_dir: Path) -> Iterator[Server]:
    args = ["--engine", "trtllm", "--mode", "encode", "--model", str(llava), *INTERNAL]
    srv = Server(args=args, env=standin_env()).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def aggregated(llava: Path, encoder: Server, log_dir: Path) -> Iterator[Server]:
    args = ["--engine", "trtllm", "--model", str(llava), "--encode-url", encoder.url, *INTERNAL]
    srv = Server(args=args, env=standin_env()).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def _ask(srv: Server, png: bytes) -> Any:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "describe the picture"},
    ]
    return client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        temperature=0,
        max_tokens=8,
    )


def test_images_are_encoded_on_the_trtllm_encode_instance(
    aggregated: Server, encoder: Server, tmp_path: Path
) -> None:
    png = tmp_path / "img.png"
    sample_images()[1].save(png, format="PNG")
    first = _ask(aggregated, png.read_bytes())
    assert first.choices[0].message.content
    remote = aggregated.metric("trtllm_gateway:remote_encode_total", 'outcome="remote"')
    assert remote == 1
    assert _ask(aggregated, png.read_bytes()).choices[0].message.content == (
        first.choices[0].message.content
    )
