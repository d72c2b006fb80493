"""POST /internal/v1/encode: an encode instance (EPD) embeds a sibling's images.

Body: embed_wire "pixels" frames (uint8 RGB, one per image, with its hash). Answer: one
"embeds" frame per image, in order, streamed as application/x-trtllm-gateway-embeds. A
disconnecting client cancels the work. 404 on instances that do not encode.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from trtllm_gateway.engine.capabilities import ImageEncoding
from trtllm_gateway.engine.disagg.embed_wire import CONTENT_TYPE
from trtllm_gateway.engine.disagg.sibling_wire import ENCODE_PATH
from trtllm_gateway.web.cancel import cancel_on_disconnect
from trtllm_gateway.web.deps import ReadyEngineDep
from trtllm_gateway.web.errors import NotFoundError

router = APIRouter(tags=["encode"], include_in_schema=False)


@router.post(ENCODE_PATH)
async def encode(request: Request, engine: ReadyEngineDep) -> Response:
    if not isinstance(engine, ImageEncoding):
        raise NotFoundError("This instance does not encode images (start one with --mode encode).")
    body = await request.body()
    frames = await cancel_on_disconnect(request.receive, engine.encode_images(body))
    return StreamingResponse(iter(frames), media_type=CONTENT_TYPE)
