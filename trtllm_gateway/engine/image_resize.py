"""The shortest edge a checkpoint's image processor resizes every image to, before it crops.

LLaVA's processors (CLIPImageProcessor, LlavaNextImageProcessor: preprocessor_config.json's
`size: {"shortest_edge": 336}`) scale an image so that its shortest edge is that long, keeping
its aspect ratio: a thin image grows along its long edge by the same factor (a 1 x 300,000 PNG of
117 bytes took a tiny LLaVA's engine core from 412 MB to 3.3 GB, issue 40). Engines report the
edge in EngineInfo.image_resize_edge, so the gateway counts an image's pixels after that resize
in its pixel bounds.
"""

from __future__ import annotations

import json
from pathlib import Path


def resize_edge(model_dir: Path | str | None) -> int:
    """preprocessor_config.json's size.shortest_edge (or the larger of height and width);
    0 when the checkpoint has none, or none that is readable."""
    if model_dir is None:
        return 0
    path = Path(model_dir) / "preprocessor_config.json"
    try:
        size = json.loads(path.read_text()).get("size")
    except (OSError, ValueError, AttributeError):
        return 0
    if isinstance(size, int):
        return size
    if not isinstance(size, dict):
        return 0
    edge = size.get("shortest_edge") or max(size.get("height") or 0, size.get("width") or 0)
    return edge if isinstance(edge, int) and edge > 0 else 0


def resized_pixels(width: int, height: int, edge: int) -> int:
    """Pixels of the image once its shortest edge is `edge` (transformers'
    get_resize_output_image_size: the long edge is int(edge * long / short))."""
    if edge <= 0:
        return width * height
    short, long = min(width, height), max(width, height)
    return edge * int(edge * long / short)
