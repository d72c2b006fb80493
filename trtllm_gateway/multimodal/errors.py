"""MediaError: every way an image can be refused, with the HTTP status the gateway maps it to.

Tree (web/errors.py reads status_code, message, param, type and code; nothing here knows HTTP):

    MediaError
    ├── MediaRejectedError   400  bad input: scheme, address, size, pixels, format, path
    ├── MediaUpstreamError   502  the remote server failed (5xx, 408/429, connection error)
    ├── MediaBusyError       503  no room in the decoded-pixel budget in time (Retry-After)
    └── MediaTimeoutError    504  the whole fetch outlived media_fetch_timeout
"""

from __future__ import annotations


class MediaError(Exception):
    """Base of every image-loading failure; never surfaces as a 500."""

    status_code: int = 400
    type: str = "invalid_request_error"

    def __init__(self, message: str, *, code: str = "invalid_image", param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        # Set by the loader, which knows the message/part indices.
        self.param = param

    def __str__(self) -> str:
        return self.message if self.param is None else f"{self.message} ({self.param})"


class MediaRejectedError(MediaError):
    """The image (or its URL) is unacceptable; retrying the same request cannot succeed."""


class MediaUpstreamError(MediaError):
    """The image host failed; a retry may succeed."""

    status_code = 502
    type = "server_error"

    def __init__(self, message: str, *, code: str = "image_fetch_failed", param: str | None = None):
        super().__init__(message, code=code, param=param)


class MediaBusyError(MediaError):
    """Other requests' images held the decoded-pixel budget for longer than the wait allowed."""

    status_code = 503
    type = "server_error"

    def __init__(self, message: str, *, code: str = "image_budget_busy", param: str | None = None):
        super().__init__(message, code=code, param=param)


class MediaTimeoutError(MediaError):
    """Fetching the image took longer than media_fetch_timeout."""

    status_code = 504
    type = "server_error"

    def __init__(
        self, message: str, *, code: str = "image_fetch_timeout", param: str | None = None
    ):
        super().__init__(message, code=code, param=param)
