"""Safe image loading for chat requests: data:, http(s) and local sources -> hashed RGB images."""

from multimodal.cache import MediaCache
from multimodal.errors import MediaError, MediaRejectedError, MediaTimeoutError, MediaUpstreamError
from multimodal.loader import IMAGE_NAMESPACE, count_images, load_chat_images
from multimodal.metrics import MediaMetrics
from multimodal.ssrf import EgressPolicy

__all__ = [
    "IMAGE_NAMESPACE",
    "EgressPolicy",
    "MediaCache",
    "MediaError",
    "MediaMetrics",
    "MediaRejectedError",
    "MediaTimeoutError",
    "MediaUpstreamError",
    "count_images",
    "load_chat_images",
]
