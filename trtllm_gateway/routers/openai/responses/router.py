"""POST /v1/responses, GET and DELETE /v1/responses/{id}: the request translated to chat
(translate.py), chat's parse and run, the Responses renderer (render.py), the store (store.py)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from trtllm_gateway.multimodal import PixelLease
from trtllm_gateway.routers.openai.chat.parse import parse_chat
from trtllm_gateway.routers.openai.event_stream import respond_events
from trtllm_gateway.routers.openai.responses.render import ResponsesRenderer, new_item_id
from trtllm_gateway.routers.openai.responses.schemas import (
    DeletedResponse,
    NamedToolChoice,
    ResponseObject,
    ResponsesRequest,
)
from trtllm_gateway.routers.openai.responses.store import ResponseStore
from trtllm_gateway.routers.openai.responses.translate import (
    LOGPROBS_INCLUDE,
    custom_tool_names,
    input_items,
    load_items,
    to_chat,
    tool_namespaces,
    wire_param,
)
from trtllm_gateway.routers.openai.run import Run, admitted
from trtllm_gateway.web import request_context
from trtllm_gateway.web.admission import Slot
from trtllm_gateway.web.deps import Serving, ServingDep, StateDep
from trtllm_gateway.web.errors import GatewayError, NotFoundError
from trtllm_gateway.web.state import State

logger = logging.getLogger(__name__)
router = APIRouter(tags=["responses"])


def get_store(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.response_store
    return store


StoreDep = Annotated[ResponseStore, Depends(get_store)]


@router.post("/v1/responses", response_model=None)
async def create_response(
    body: ResponsesRequest,
    request: Request,
    serving: ServingDep,
    state: StateDep,
    store: StoreDep,
) -> Response:
    request_id = request_context.new_request_id("resp")
    slot = serving.admission.reserve(1)  # before any work: 503 + Retry-After when full
    pixels = state.metrics.pixels.lease()
    slot.on_release(pixels.release)
    handler = _create(body, serving, state, request_id, store, pixels, slot)
    return await admitted(slot, request, handler)


async def _create(
    body: ResponsesRequest,
    serving: Serving,
    state: State,
    request_id: str,
    store: ResponseStore,
    pixels: PixelLease,
    slot: Slot,
) -> Response:
    history = await _previous(body.previous_response_id, store, slot)
    new_items = input_items(body)
    try:
        chat = to_chat(body, [*load_items(history), *new_items])
        run = Run(serving, chat, request_id)
        parsed = await parse_chat(chat, serving, state, run, pixels)
    except GatewayError as exc:
        exc.param = wire_param(exc.param)
        raise
    (choice,) = parsed.choices
    logprobs = LOGPROBS_INCLUDE in (body.include or ())
    renderer = ResponsesRenderer(
        _skeleton(body, run.envelope.model),
        serving.tokenizer,
        choice.output,
        parsed.reply,
        parsed.prompt_tokens,
        custom_tool_names(body),
        top_logprobs=(body.top_logprobs or 0) if logprobs else None,
        namespaces=tool_namespaces(body),
    )

    async def store_it() -> None:
        final = renderer.final
        if not body.store or final is None:
            return
        output = [i.model_dump(mode="json", exclude_none=True) for i in final.output]
        given = [
            stored_item(i.model_dump(mode="json", by_alias=True, exclude_none=True))
            for i in new_items
        ]
        record = {
            "response": final.model_dump(mode="json"),
            "conversation": history + given + output,
        }
        try:
            await asyncio.to_thread(store.put, final.id, record)
        except sqlite3.Error as exc:  # the answer stands; only its continuation is lost
            logger.warning("response %s not stored: %r", final.id, exc)

    items = run.generate(parsed.choices)
    return await respond_events(run, items, renderer, bool(body.stream), store_it)


async def _previous(
    response_id: str | None, store: ResponseStore, slot: Slot
) -> list[dict[str, Any]]:
    """The conversation previous_response_id ended, pinned in the store until the response
    ends; a 404 when it is not there."""
    if response_id is None:
        return []
    record = await asyncio.to_thread(store.get, response_id, True)
    if record is None:
        raise _not_found(response_id, store, "previous_response_id")
    loop = asyncio.get_running_loop()

    def unpin() -> None:  # off the loop: a sqlite write
        loop.run_in_executor(None, store.unpin, response_id)

    slot.on_release(unpin)
    conversation: list[dict[str, Any]] = record["conversation"]
    return conversation


def _not_found(response_id: str, store: ResponseStore, param: str | None) -> NotFoundError:
    limits = store.limits
    return NotFoundError(
        f"Response '{response_id}' not found: it was never stored (store: false), was deleted, "
        f"or was evicted from the response store (it keeps the {limits.max_count} most recently "
        f"used responses, {limits.max_bytes} bytes, for {limits.max_age_s:g} s).",
        param=param,
        code="response_not_found",
    )


def _skeleton(body: ResponsesRequest, model: str) -> ResponseObject:
    """The response as created: in progress, no output yet."""
    tool_choice: Any = body.tool_choice or "auto"
    if isinstance(tool_choice, NamedToolChoice):
        tool_choice = tool_choice.model_dump(exclude_none=True)
    text = {"format": {"type": "text"}}
    if body.text is not None and body.text.format is not None:
        text = {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)}
    return ResponseObject(
        id=new_item_id("resp"),
        created_at=int(time.time()),
        status="in_progress",
        model=model,
        instructions=body.instructions,
        previous_response_id=body.previous_response_id,
        tools=[t.model_dump(exclude_none=True) for t in body.tools or ()],
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        temperature=body.temperature,
        top_p=body.top_p,
        max_output_tokens=body.max_output_tokens,
        text=text,
        reasoning=body.reasoning.model_dump(exclude_none=True) if body.reasoning else None,
        store=body.store is not False,
        metadata=body.metadata or {},
        user=body.user,
    )


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(response_id: str, store: StoreDep) -> Response:
    record = await asyncio.to_thread(store.get, response_id)
    if record is None:
        raise _not_found(response_id, store, None)
    return JSONResponse(record["response"])


_ID_PREFIXES = {"function_call": "fc", "custom_tool_call": "ctc", "reasoning": "rs"}


def stored_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as stored and listed: with an id, a message's text as a part (OpenAI
    lists both so)."""
    if not item.get("id") and item.get("type") != "item_reference":
        item["id"] = new_item_id(_ID_PREFIXES.get(item.get("type", ""), "msg"))
    if item.get("type") == "message" and isinstance(item.get("content"), str):
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        item["content"] = [{"type": kind, "text": item["content"]}]
    return item


@router.get("/v1/responses/{response_id}/input_items", response_model=None)
async def list_input_items(
    response_id: str,
    store: StoreDep,
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> Response:
    """The conversation the response answered (every turn's input and output before its own
    output), a page at a time as OpenAI lists it."""
    record = await asyncio.to_thread(store.get, response_id)
    if record is None:
        raise _not_found(response_id, store, None)
    conversation: list[dict[str, Any]] = record["conversation"]
    items = conversation[: len(conversation) - len(record["response"]["output"])]
    if order == "desc":
        items = items[::-1]
    if after is not None:
        ids = [i.get("id") for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        }
    )


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete_response(response_id: str, store: StoreDep) -> Response:
    if not await asyncio.to_thread(store.delete, response_id):
        raise _not_found(response_id, store, None)
    return JSONResponse(DeletedResponse(id=response_id).model_dump(mode="json"))
