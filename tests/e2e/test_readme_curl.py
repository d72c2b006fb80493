"""The curl examples of the README and docs/ (each marked `<!-- readme-test -->`), run verbatim
(only the port changes) against the real server."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.server import Server

BLOCK = re.compile(r"<!-- readme-test -->\n```bash\n(.*?)```", re.S)
ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = [e for page in PAGES for e in BLOCK.findall(page.read_text())]


def test_readme_has_curl_examples() -> None:
    assert len(EXAMPLES) >= 4
    assert all("curl" in e for e in EXAMPLES)


@pytest.mark.parametrize("script", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_readme_example_runs(server: Server, script: str) -> None:
    script = script.replace("http://localhost:8000", server.url)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout
    assert out.strip()
    if '"stream": true' in script and "/v1/responses" in script:
        # Responses streams end with their last named event, not [DONE]
        assert "event: response.completed" in out or "event: response.incomplete" in out
        assert "[DONE]" not in out
    elif '"stream": true' in script:
        assert out.rstrip().endswith("data: [DONE]")
    if "chat/completions" in script and '"stream"' not in script:
        assert '"finish_reason"' in out and "Paris" in out
    if "/v1/responses" in script and '"stream"' not in script:
        assert '"status":"completed"' in out.replace(" ", "") and "Paris" in out
    if "/v1/messages" in script:
        assert '"stop_reason"' in out and "Paris" in out
