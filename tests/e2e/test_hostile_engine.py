"""Hostile requests that reached the engine core (issue 40 items 1, 2, 5, 7), beside victims.

On real servers: SmolLM2 with the logits processor of engine/logits/processor.py's docstring
(`--logits-processor tests.engine.docstring_processor:Ban`), and a tiny random LLaVA. Before the
fixes, `{"ban": [1, 2]}` and an image_embeds tensor of the wrong width each ended the engine core
(503 for everyone, the server exited); a 1 x 300,000 PNG of a few hundred bytes took the core
from 412 MB to 3.3 GB for 11.6 s; an image_embeds data: URL past max_model_len x 64 characters
was a context_length_exceeded. Each attack here is answered with its error while ordinary
requests beside it get the answers they get alone, and the server lives on.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch
from PIL import Image

from tests.e2e.server import Server
from tests.e2e.victims import VICTIM_PROMPTS, alone, chat, victims
from tests.engine.tiny_llava import build_tiny_llava, sample_images
from trtllm_gateway.engine.builtin.vision.spec import read_spec
from trtllm_gateway.engine.disagg.embed_wire import encode_frame
from trtllm_gateway.engine.model_source import resolve_model
from trtllm_gateway.engine.tokenizer import Tokenizer

DOCSTRING_BAN = "tests.engine.docstring_processor:Ban"
OCTET = "application/octet-stream"


@pytest.fixture(scope="module")
def banning(log_dir: Path) -> Iterator[Server]:
    srv = Server(args=["--num-kv-blocks", "512", "--logits-processor", DOCSTRING_BAN])
    srv.start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


async def test_a_logits_processor_that_raises_in_setup_fails_only_its_request(
    banning: Server,
) -> None:
    url = f"{banning.url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=120) as client:
        want = await alone(client, banning.url)
        attacks = [
            client.post(url, json=chat("Hi", vllm_xargs={"ban": [1, 2]})),  # int([1, 2])
            client.post(url, json=chat("Hi", vllm_xargs={"ban": 10**9}, stream=True)),
        ]
        *hits, beside = await asyncio.gather(*attacks, victims(client, banning.url))
        for r in hits:
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "vllm_xargs" and "ban must be a token id" in error["message"]
        assert beside == want
        # The processor works for a request that uses it right, and the engine is alive.
        first = await client.post(url, json=chat(VICTIM_PROMPTS[0], max_tokens=1))
        first_text = first.json()["choices"][0]["message"]["content"]
        (banned,) = Tokenizer.from_dir(resolve_model("default")).encode(
            first_text, add_special_tokens=False
        )
        r = await client.post(url, json=chat(VICTIM_PROMPTS[0], vllm_xargs={"ban": banned}))
        assert r.status_code == 200, r.text
        assert not r.json()["choices"][0]["message"]["content"].startswith(first_text)
        assert (await client.get(f"{banning.url}/health")).status_code == 200
    assert banning.proc is not None and banning.proc.poll() is None


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("llava-hostile") / "model", "llava")


@pytest.fixture(scope="module")
def vlm(llava_dir: Path, log_dir: Path) -> Iterator[Server]:
    args = ["--model", str(llava_dir), "--device", "cpu", "--dtype", "float32"]
    srv = Server(args=[*args, "--num-kv-blocks", "512", "--block-size", "4"]).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def llava_chat(*parts: dict[str, Any], text: str = "describe the picture") -> dict[str, Any]:
    return {
        "model": "model",
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }


def png_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def embeds_part(shape: tuple[int, int], layout: str, dtype: torch.dtype) -> dict[str, Any]:
    tensor = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    name = str(dtype).removeprefix("torch.")
    frame = encode_frame("embeds", "client", name, shape, raw, layout)
    url = f"data:{OCTET};base64,{base64.b64encode(frame).decode()}"
    return {"type": "image_embeds", "image_embeds": {"url": url}}


async def llava_victims(client: httpx.AsyncClient, url: str) -> list[str]:
    """A text request and an image request: each one's text (each must be a 200)."""
    bodies = [
        llava_chat(text="say hello"),
        llava_chat(image_part(png_url(sample_images()[0]))),
    ]
    out = []
    for r in await asyncio.gather(*(client.post(url, json=b) for b in bodies)):
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def tree_rss(pid: int) -> int:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in (proc, *proc.children(recursive=True)))


async def test_embeddings_and_images_the_model_cannot_take_are_400s_beside_victims(
    vlm: Server, llava_dir: Path
) -> None:
    url = f"{vlm.url}/v1/chat/completions"
    layout = read_spec(llava_dir).layout  # the model's own: only the shape is wrong
    thin = png_url(Image.new("1", (1, 300_000)))
    assert len(thin) < 2_000
    async with httpx.AsyncClient(timeout=120) as client:
        want = await llava_victims(client, url)
        assert vlm.proc is not None
        rss_before = tree_rss(vlm.proc.pid)
        started = time.monotonic()
        narrow = client.post(url, json=llava_chat(embeds_part((5, 7), layout, torch.float32)))
        thin_hit = client.post(url, json=llava_chat(image_part(thin)))
        *hits, beside = await asyncio.gather(narrow, thin_hit, llava_victims(client, url))
        elapsed = time.monotonic() - started
        grew = tree_rss(vlm.proc.pid) - rss_before
        assert beside == want
        narrow_r, thin_r = hits
        assert narrow_r.status_code == 400, narrow_r.text
        assert narrow_r.json()["error"]["param"] == "messages"
        assert "[tokens, 64]" in narrow_r.json()["error"]["message"]
        assert thin_r.status_code == 400, thin_r.text
        assert thin_r.json()["error"]["code"] == "image_aspect_ratio"
        assert elapsed < 30 and grew < 300 * 2**20, (elapsed, grew)  # 11.6 s, +2.9 GB before
        assert await llava_victims(client, url) == want
        assert (await client.get(f"{vlm.url}/health")).status_code == 200
    assert vlm.proc.poll() is None


async def test_a_real_size_embedding_as_a_data_url_is_not_prompt_text(
    vlm: Server, llava_dir: Path
) -> None:
    """300 rows of this 64-wide model in float16 are 51,200 base64 characters, more than
    max_model_len (512) x 64: the text bound refused them as context_length_exceeded."""
    layout = read_spec(llava_dir).layout
    part = embeds_part((300, 64), layout, torch.float16)
    assert len(part["image_embeds"]["url"]) > 512 * 64
    async with httpx.AsyncClient(timeout=120) as client:
        r = await client.post(f"{vlm.url}/v1/chat/completions", json=llava_chat(part))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 300  # the rows took their places in the prompt
