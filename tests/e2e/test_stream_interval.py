"""--stream-interval over real HTTP: chunks of N tokens after the first, the same text as one
token per chunk (the shared server), and usage that counts every token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import Server

BODY = {
    "prompt": "The three primary colors are",
    "max_tokens": 13,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}


@pytest.fixture(scope="module")
def interval_server(log_dir: Path) -> Iterator[Server]:
    srv = Server(args=["--num-kv-blocks", "256", "--stream-interval", "4"]).start(log_dir)
    yield srv
    assert srv.stop() == 0, srv.log()


def stream(url: str) -> tuple[list[str], list[int]]:
    """The text of each content chunk and the running completion_tokens after it."""
    texts, counts = [], []
    with httpx.stream("POST", f"{url}/v1/completions", json=BODY, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                texts.append(chunk["choices"][0]["text"])
                counts.append(chunk["usage"]["completion_tokens"])
    return texts, counts


def test_chunks_of_four_same_text(server: Server, interval_server: Server) -> None:
    one_texts, one_counts = stream(server.url)
    four_texts, four_counts = stream(interval_server.url)
    assert "".join(four_texts) == "".join(one_texts)
    assert one_counts == list(range(1, 14))
    assert four_counts == [1, 5, 9, 13]  # the first token at once, then 4 per chunk
