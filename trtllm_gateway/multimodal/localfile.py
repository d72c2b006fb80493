"""Read local image files confined to --allowed-local-media-path: no traversal or symlink escape."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from trtllm_gateway.multimodal.errors import MediaRejectedError

_PROC_FD = Path("/proc/self/fd")


def is_local_reference(url: str) -> bool:
    """`file:` URLs and plain paths (no URL scheme) name local files."""
    scheme = urlsplit(url).scheme.lower()
    return scheme in ("", "file")


def resolve_local_path(url: str, base: Path) -> Path:
    """Map a `file:` URL or plain path to a real path inside base, or raise MediaRejectedError.

    Relative paths are taken relative to base. Symlinks are resolved before the containment
    check, so one pointing outside base is refused whether or not its target exists.
    """
    if "\x00" in url:
        raise _refused("local image path contains a NUL byte")
    parts = urlsplit(url)
    if parts.scheme.lower() == "file":
        if parts.netloc not in ("", "localhost"):
            raise _refused("file: URLs must not name a remote host")
        raw = unquote(parts.path)
    else:
        raw = url
    if not raw or "\x00" in raw:
        raise _refused("local image path is empty")
    try:
        root = base.resolve(strict=True)
        candidate = (root / raw).resolve()
    except (OSError, RuntimeError, ValueError):
        raise _refused("local image path cannot be resolved") from None
    if not candidate.is_relative_to(root):
        raise _refused("local image path is outside the allowed media path")
    return candidate


def read_local_file(path: Path, root: Path, *, max_bytes: int) -> bytes:
    """Read a regular file (blocking: run it in a thread); refuses FIFOs, devices and late swaps."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise _refused("local image file not found") from None
    except OSError:
        raise _refused("local image file cannot be opened") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refused("local image path is not a regular file")
        _check_still_inside(fd, root)
        if info.st_size > max_bytes:
            raise _too_big(max_bytes)
        data = _read_at_most(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise _too_big(max_bytes)
    return data


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def _check_still_inside(fd: int, root: Path) -> None:
    """A directory swapped for a symlink between resolve and open is caught here (Linux)."""
    link = _PROC_FD / str(fd)
    try:
        opened = Path(os.readlink(link))
    except OSError:
        return  # no /proc: the resolve-time check stands alone
    if not opened.is_relative_to(root.resolve()):
        raise _refused("local image path is outside the allowed media path")


def _refused(message: str) -> MediaRejectedError:
    return MediaRejectedError(message, code="invalid_image_url")


def _too_big(max_bytes: int) -> MediaRejectedError:
    return MediaRejectedError(
        f"image is larger than the {max_bytes} byte limit", code="image_too_large"
    )
