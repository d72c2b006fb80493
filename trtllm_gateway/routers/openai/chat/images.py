"""Chat messages for the template, with images: image_url parts -> placeholders and ImageInputs.

The chat template decides where an image's placeholder text goes: a template that loops over
typed content parts ("openai" format, e.g. llava-hf's) gets {"type": "image"} parts and writes
the token itself; a plain-string template gets the tokenizer's image token in the image's place.
The tokenizer then encodes one image token per image; the engine expands it.
"""

from __future__ import annotations

import json
from typing import Any

from trtllm_gateway.engine.protocol import EngineInfo, ImageInput
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.multimodal import PixelLease, count_images, load_chat_images
from trtllm_gateway.routers.openai.schemas import ChatMessage, ToolCall
from trtllm_gateway.web.errors import BadRequestError
from trtllm_gateway.web.state import State

NO_IMAGES = "This model does not accept images."
IMAGE_PARTS = ("image_url", "image_embeds")  # an image, or its precomputed embedding


async def load_images(
    messages: list[ChatMessage], info: EngineInfo, state: State, pixels: PixelLease
) -> list[ImageInput]:
    """Every image of the request, in order; refuses before fetching when the model takes none.
    Their decoded pixels are reserved on `pixels` (the request's lease on the shared budget).

    Raises BadRequestError, or MediaError (400/502/504, param messages[i].content[j].image_url).
    """
    raw = [m.model_dump(exclude_none=True) for m in messages]
    n = count_images(raw)
    if n == 0:
        return []
    if not info.supports_images:
        raise BadRequestError(NO_IMAGES, param="messages", code="images_not_supported")
    return await load_chat_images(
        raw,
        client=state.http,
        config=state.config.media,
        cache=state.media_cache,
        metrics=state.metrics.media,
        pixels=pixels,
        resize_edge=info.image_resize_edge,
    )


def template_messages(messages: list[ChatMessage], tokenizer: Tokenizer) -> list[dict[str, Any]]:
    fmt = tokenizer.content_format
    image_token = tokenizer.image_token
    return [_template_message(m, i, fmt == "openai", image_token) for i, m in enumerate(messages)]


def _template_message(
    message: ChatMessage, index: int, typed_parts: bool, image_token: str | None
) -> dict[str, Any]:
    content: Any = message.content
    if typed_parts:
        if isinstance(content, list):
            content = [
                {"type": "image"}
                if p.type in IMAGE_PARTS
                else {"type": "text", "text": p.text or ""}
                for p in content
            ]
        else:
            content = [{"type": "text", "text": content}] if content else []
    elif isinstance(content, list):
        texts = []
        for part in content:
            if part.type not in IMAGE_PARTS:
                texts.append(part.text or "")
            elif image_token is None:
                raise BadRequestError(
                    "This model's tokenizer has no image token.",
                    param=f"messages[{index}].content",
                )
            else:
                texts.append(image_token)
        content = "\n".join(texts)
    out: dict[str, Any] = {**(message.model_extra or {}), "role": message.role}
    out["content"] = content or ("" if not typed_parts else [])
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [_template_tool_call(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _template_tool_call(call: ToolCall) -> dict[str, Any]:
    """A past call for the template: arguments as a dict (templates `tojson` them, as vLLM
    passes them), or the text when it is not a JSON object."""
    try:
        arguments: Any = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    if not isinstance(arguments, dict):
        arguments = call.function.arguments
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": call.type, "function": function}
