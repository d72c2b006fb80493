"""Safe image loading for chat requests: data:, http(s) and local sources -> hashed RGB images."""

from trtllm_gateway.multimodal.cache import MediaCache
from trtllm_gateway.multimodal.errors import (
    MediaBusyError,
    MediaError,
    MediaRejectedError,
    MediaTimeoutError,
    MediaUpstreamError,
)
from trtllm_gateway.multimodal.loader import IMAGE_NAMESPACE, count_images, load_chat_images
from trtllm_gateway.multimodal.metrics import MediaMetrics
from trtllm_gateway.multimodal.pixel_budget import PixelBudget, PixelLease, create_pixel_budget
from trtllm_gateway.multimodal.ssrf import EgressPolicy

__all__ = [
    "IMAGE_NAMESPACE",
    "EgressPolicy",
    "MediaBusyError",
    "MediaCache",
    "MediaError",
    "MediaMetrics",
    "MediaRejectedError",
    "MediaTimeoutError",
    "MediaUpstreamError",
    "PixelBudget",
    "PixelLease",
    "count_images",
    "create_pixel_budget",
    "load_chat_images",
]
