"""MediaConfig: image loading (allowed sources, size and time limits, the decoded-image cache).

Private, loopback and link-local hosts are refused unless opted in."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class MediaConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_local_media_path: Path | None = Field(
        None, description="Directory file:// and plain-path images may come from (unset: none)."
    )
    allowed_media_domains: list[str] = Field(
        default_factory=list,
        description="Image hosts allowed over http(s), exact or subdomain (empty: any public).",
    )
    allow_private_media_urls: bool = Field(
        False, description="Allow image URLs on private, loopback and link-local addresses."
    )
    media_fetch_timeout: float = Field(
        10.0, gt=0.0, description="Seconds for a whole image fetch (DNS, redirects, body)."
    )
    max_image_bytes: int = Field(
        20 * 1024 * 1024, ge=1, description="Largest encoded image accepted, in bytes."
    )
    max_image_pixels: int = Field(
        40_000_000, ge=1, description="Largest image accepted, in pixels (width x height)."
    )
    max_image_pixels_in_flight: int | None = Field(
        None,
        ge=0,
        description="Decoded image pixels all requests may hold at once (every API server's "
        "together); a request waits up to --media-fetch-timeout for room (then 503), more "
        "than all of it is a 400 (unset: 2 x --max-image-pixels; 0: no bound).",
    )
    max_image_aspect_ratio: float = Field(
        200.0,
        ge=1.0,
        description="Largest ratio of an image's long edge to its short edge (Qwen2-VL's image "
        "processor refuses past 200 too); the model's processor enlarges a thin image until its "
        "short edge fits, so a 1 x 300,000 PNG of 117 bytes became gigabytes of pixels.",
    )
    max_images_per_request: int = Field(8, ge=0, description="Most images in one request.")
    max_redirects: int = Field(5, ge=0, description="Most redirects followed per image URL.")
    media_cache_bytes: int = Field(
        512 * 1024 * 1024, ge=0, description="Decoded-image LRU cache size in bytes (0: off)."
    )
