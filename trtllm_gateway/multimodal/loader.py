"""load_chat_images: the entry point routers call to turn chat `image_url` parts into ImageInputs.

Two passes, each over every image of the request concurrently in one TaskGroup (the first
failure cancels the rest, and cancelling the caller cancels them all; blocking work runs in
asyncio.to_thread): read each image and its size from the header, then, once the request's
decoded pixels are reserved in the shared PixelBudget, decode them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
from PIL import Image

from trtllm_gateway.config.media import MediaConfig
from trtllm_gateway.engine.protocol import ImageInput
from trtllm_gateway.multimodal.cache import MediaCache
from trtllm_gateway.multimodal.dataurl import decode_data_url, is_data_url
from trtllm_gateway.multimodal.embeds import decode_embeds
from trtllm_gateway.multimodal.errors import (
    MediaBusyError,
    MediaError,
    MediaRejectedError,
    MediaTimeoutError,
    MediaUpstreamError,
)
from trtllm_gateway.multimodal.fetch import FetchLimits, fetch_url
from trtllm_gateway.multimodal.images import (
    checked_pixels,
    decode_image,
    hash_image_bytes,
    image_pixels,
    rgb_nbytes,
)
from trtllm_gateway.multimodal.localfile import (
    is_local_reference,
    read_local_file,
    resolve_local_path,
)
from trtllm_gateway.multimodal.metrics import MediaMetrics, Outcome, Source
from trtllm_gateway.multimodal.pixel_budget import PixelLease
from trtllm_gateway.multimodal.ssrf import EgressPolicy

IMAGE_NAMESPACE = "image/rgb"
_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image_url (or image_embeds: a precomputed embedding) part and where it sits."""

    message_index: int
    part_index: int
    url: object
    kind: Literal["image_url", "image_embeds"] = "image_url"

    @property
    def param(self) -> str:
        return f"messages[{self.message_index}].content[{self.part_index}].{self.kind}"


def iter_image_refs(messages: Sequence[Mapping[str, Any]]) -> Iterator[ImageRef]:
    """image_url parts in request order; accepts {"url": ...} objects and the bare-string form."""
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            # A programming error (e.g. pydantic models passed un-dumped), not a client one.
            raise TypeError(f"messages[{i}] must be a mapping, got {type(message).__name__}")
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in ("image_url", "image_embeds"):
                source = part.get(kind)
                url = source.get("url") if isinstance(source, Mapping) else source
                yield ImageRef(i, j, url, kind)


def count_images(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many images a request carries, without fetching (text-only models refuse early)."""
    return sum(1 for _ in iter_image_refs(messages))


def egress_policy(config: MediaConfig) -> EgressPolicy:
    return EgressPolicy(
        allowed_domains=tuple(config.allowed_media_domains),
        allow_private=config.allow_private_media_urls,
    )


async def load_chat_images(
    messages: Sequence[Mapping[str, Any]],
    *,
    client: httpx.AsyncClient,
    config: MediaConfig,
    cache: MediaCache,
    metrics: MediaMetrics | None = None,
    policy: EgressPolicy | None = None,
    pixels: PixelLease | None = None,
    resize_edge: int = 0,
) -> list[ImageInput]:
    """Load every image of a chat request, in order, as ImageInput(hash, RGB PIL image).

    Raises MediaError with param "messages[i].content[j].image_url" (400, 502 or 504); the
    returned images are shared with the cache and must not be mutated. `pixels`: the request's
    lease on the shared budget; the images' pixels are reserved on it before any is decoded
    (MediaBusyError 503 after media_fetch_timeout, 400 past the whole budget), and the caller
    releases it once the images are dropped. resize_edge: the shortest edge the model's
    processor resizes images to (EngineInfo.image_resize_edge): an image counts the pixels it
    will have then, if more than its own.
    """
    refs = list(iter_image_refs(messages))
    limit = config.max_images_per_request
    if len(refs) > limit:
        raise MediaRejectedError(
            f"at most {limit} images are allowed per request, got {len(refs)}",
            code="too_many_images",
            param=refs[limit].param,
        )
    if not refs:
        return []
    loader = _Loader(
        client,
        config,
        cache,
        metrics or MediaMetrics(),
        policy or egress_policy(config),
        resize_edge,
    )
    try:
        staged = await _each(loader.stage, refs, refs)
        if pixels is not None:
            await pixels.acquire(sum(s.pixels for s in staged), config.media_fetch_timeout)
        return await _each(loader.finish, staged, refs)
    except BaseException as exc:
        if isinstance(exc, MediaError) and exc.param is None:
            exc.param = "messages"  # the budget's refusal is about all the request's images
        # Images read but never decoded: a sibling failed, or the budget refused or waited.
        for s in loader.unfinished:
            loader.record(s.ref, s.source, exc, s.nbytes)
        raise


async def _each(
    load: Callable[[_T], Coroutine[Any, Any, _R]], items: Sequence[_T], refs: list[ImageRef]
) -> list[_R]:
    """load(item) for every item at once, in order; the earliest image's MediaError wins."""
    if len(items) == 1:
        return [await load(items[0])]
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(load(item)) for item in items]
    except BaseExceptionGroup as eg:
        raise _first_media_error(eg, refs) from None
    return [task.result() for task in tasks]


def _first_media_error(
    eg: BaseExceptionGroup[BaseException], refs: list[ImageRef]
) -> BaseException:
    """The failure of the earliest image, so the error names a stable param."""
    order = {ref.param: k for k, ref in enumerate(refs)}
    media, rest = eg.split(MediaError)
    if rest is not None or media is None:
        return eg
    errors = [e for e in media.exceptions if isinstance(e, MediaError)]
    return min(errors, key=lambda e: order.get(e.param or "", len(order)))


@dataclass(slots=True)
class _Loader:
    client: httpx.AsyncClient
    config: MediaConfig
    cache: MediaCache
    metrics: MediaMetrics
    policy: EgressPolicy
    resize_edge: int = 0
    unfinished: list[_Staged] = field(default_factory=list)

    async def stage(self, ref: ImageRef) -> _Staged:
        """Read one image and size it (header only); a cache hit or an embedding is ready."""
        source: Source = "other"
        nbytes = 0
        try:
            if not isinstance(ref.url, str) or not ref.url:
                raise MediaRejectedError(f"{ref.kind}.url must be a non-empty string")
            source = _source_of(ref.url)
            data = await self._read(ref.url, source)
            nbytes = len(data)
            if ref.kind == "image_embeds":
                embeds = await asyncio.to_thread(decode_embeds, data)
                return self._staged(_Staged(ref, source, nbytes, ready=embeds))
            image_hash = await asyncio.to_thread(hash_image_bytes, data)
            cached = self.cache.get(IMAGE_NAMESPACE, image_hash)
            if isinstance(cached, Image.Image):
                self.metrics.cache_hits += 1
                ready = ImageInput(hash=image_hash, payload=cached)
                pixels = self._pixels(cached.size)
                return self._staged(_Staged(ref, source, nbytes, pixels, ready=ready))
            self.metrics.cache_misses += 1
            pixels = await asyncio.to_thread(image_pixels, data, **self._limits())
            staged = _Staged(ref, source, nbytes, pixels, data=data, image_hash=image_hash)
            return self._staged(staged)
        except BaseException as exc:
            self.record(ref, source, exc, nbytes)
            raise

    async def finish(self, staged: _Staged) -> ImageInput:
        """The staged image decoded (its pixels already reserved), or as staged."""
        self.unfinished.remove(staged)
        try:
            if staged.ready is not None:
                image = staged.ready
            else:
                assert staged.data is not None
                image = await self._decode(staged.data, staged.image_hash)
        except BaseException as exc:
            self.record(staged.ref, staged.source, exc, staged.nbytes)
            raise
        self.metrics.record(staged.source, "ok", staged.nbytes)
        return image

    def _limits(self) -> dict[str, Any]:
        return {
            "max_pixels": self.config.max_image_pixels,
            "max_aspect_ratio": self.config.max_image_aspect_ratio,
            "resize_edge": self.resize_edge,
        }

    def _pixels(self, size: tuple[int, int]) -> int:
        """A cached image's pixels as the model will see them (it passed the checks once)."""
        return checked_pixels(size, **self._limits())

    def record(self, ref: ImageRef, source: Source, exc: BaseException, nbytes: int) -> None:
        """One image's failed outcome; an image's own MediaError names its param."""
        outcome: Outcome = "cancelled"
        if isinstance(exc, MediaError):
            outcome = _outcome_of(exc)
            if exc.param is None:
                exc.param = ref.param
        self.metrics.record(source, outcome, nbytes)

    def _staged(self, staged: _Staged) -> _Staged:
        self.unfinished.append(staged)
        return staged

    async def _read(self, url: str, source: Source) -> bytes:
        config = self.config
        if source == "data":
            return await asyncio.to_thread(decode_data_url, url, max_bytes=config.max_image_bytes)
        if source == "http":
            limits = FetchLimits(
                max_bytes=config.max_image_bytes,
                timeout=config.media_fetch_timeout,
                max_redirects=config.max_redirects,
            )
            return await fetch_url(url, client=self.client, policy=self.policy, limits=limits)
        if source == "file":
            return await self._read_file(url)
        raise MediaRejectedError(
            "unsupported image URL: use http(s), a base64 data: URL or an allowed local file",
            code="invalid_image_url",
        )

    async def _read_file(self, url: str) -> bytes:
        base = self.config.allowed_local_media_path
        if base is None:
            raise MediaRejectedError(
                "local image files are not enabled on this server", code="invalid_image_url"
            )
        try:
            async with asyncio.timeout(self.config.media_fetch_timeout):
                return await asyncio.to_thread(_read_confined, url, base, self.config)
        except TimeoutError:
            raise MediaTimeoutError("reading the local image file timed out") from None

    async def _decode(self, data: bytes, image_hash: str) -> ImageInput:
        image = await asyncio.to_thread(decode_image, data, **self._limits())
        self.metrics.images_decoded += 1
        self.cache.put(IMAGE_NAMESPACE, image_hash, image, rgb_nbytes(image))
        return ImageInput(hash=image_hash, payload=image)


@dataclass(frozen=True, slots=True, eq=False)  # by identity: unfinished.remove(staged)
class _Staged:
    """An image read and sized, not decoded yet: its bytes, or what is ready without decoding
    (a cache hit, whose pixels count as the request's too while it holds them; an embedding)."""

    ref: ImageRef
    source: Source
    nbytes: int
    pixels: int = 0
    data: bytes | None = None
    image_hash: str = ""
    ready: ImageInput | None = None


def _read_confined(url: str, base: Path, config: MediaConfig) -> bytes:
    path = resolve_local_path(url, base)
    return read_local_file(path, base, max_bytes=config.max_image_bytes)


def _source_of(url: str) -> Source:
    if is_data_url(url):
        return "data"
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        return "http"
    if is_local_reference(url):
        return "file"
    return "other"


def _outcome_of(exc: MediaError) -> Outcome:
    if isinstance(exc, MediaTimeoutError | MediaBusyError):
        return "timeout"
    if isinstance(exc, MediaUpstreamError):
        return "upstream_error"
    return "rejected"
