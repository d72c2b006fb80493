"""The lifespan: build the engine and the shared httpx client, load in the background, stop.

The engine loads in a background task so uvicorn serves /health (503 "loading") at once; the
tokenizer is loaded after the engine has resolved its model directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx
from fastapi import FastAPI

from trtllm_gateway.app.drain import Drain
from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.config.gateway import GatewayConfig
from trtllm_gateway.engine.capabilities import EngineExtras, KvEventSource
from trtllm_gateway.engine.factory import create_engine
from trtllm_gateway.engine.kv_events.zmq_publisher import ZmqKvPublisher
from trtllm_gateway.engine.protocol import EngineBase
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.multimodal import MediaCache
from trtllm_gateway.web.metrics import GatewayMetrics
from trtllm_gateway.web.prefill_queue import PrefillQueue
from trtllm_gateway.web.state import State
from trtllm_gateway.web.tracing import Tracer

logger = logging.getLogger(__name__)


def tokenizer_dir(engine: EngineConfig, extras: EngineExtras) -> Path:
    """--tokenizer, else the directory the engine resolved, else --model when it is a directory."""
    if engine.tokenizer:
        return Path(engine.tokenizer)
    if extras.tokenizer_dir is not None:
        return extras.tokenizer_dir
    if Path(engine.model).is_dir():
        return Path(engine.model)
    raise RuntimeError(f"no tokenizer directory for model {engine.model!r}; pass --tokenizer")


async def _load(state: State, publishers: list[ZmqKvPublisher]) -> None:
    # The tokenizer's imports overlap the engine's load (a server was ready ~0.8 s later).
    imports = asyncio.create_task(asyncio.to_thread(Tokenizer.warm_imports))
    try:
        await state.engine.start()
        s = state.config.disagg
        if s.kv_events_zmq and isinstance(state.engine, KvEventSource):
            pub = ZmqKvPublisher(
                state.engine.kv_event_log,
                s.kv_events_zmq,
                s.kv_events_format,
                topic=s.kv_events_topic,
                replay=s.kv_events_replay,
                rank=state.config.engine.data_parallel_rank,
            )
            publishers.append(pub)
            logger.info("KV events on ZMQ %s (%s format)", pub.address, s.kv_events_format)
        batch = state.engine.info.max_batch_size
        if batch and batch != state.admission.running_limit:
            logger.info("admission sized for the engine's max_batch_size %d", batch)
            state.admission.set_running_limit(batch)
        extras = state.engine.extras  # complete now that start() returned
        path = tokenizer_dir(state.config.engine, extras)
        with contextlib.suppress(Exception):  # from_dir says what is missing, if anything
            await imports
        state.tokenizer = await asyncio.to_thread(
            Tokenizer.from_dir, path, state.config.serving.chat_template
        )
        state.tokenizer_path = str(path.resolve())
        _bind_metrics(state, extras)
        if state.admission.shared is not None:  # ready once every API server is
            state.admission.shared.mark_ready()
        logger.info("ready: model %s (tokenizer from %s)", state.model_name, path)
    except Exception as exc:
        logger.exception("engine failed to start")
        state.start_error = f"{type(exc).__name__}: {exc}"
    finally:
        imports.add_done_callback(_drop_result)  # at once when it is done already


async def _sync_counters(metrics: GatewayMetrics, every_s: float = 1.0) -> None:
    """This server's own counters into the shared files, whichever server a scrape reaches."""
    while True:
        await asyncio.sleep(every_s)
        try:
            metrics.sync_counters()
        except Exception:  # a metrics fault must not end the server's loop
            logger.exception("syncing the metrics counters failed")


def _drop_result(task: asyncio.Task[None]) -> None:
    """The warm-up's own failure is from_dir's to report; none is left unretrieved."""
    if not task.cancelled():
        task.exception()


def _bind_metrics(state: State, extras: EngineExtras) -> None:
    state.metrics.bind_engine(state.engine.health, state.model_name)
    if extras.remote_prefill is not None:
        state.metrics.bind_remote_prefill(extras.remote_prefill)
    if extras.kv_routing is not None:
        state.metrics.bind_kv_routing(extras.kv_routing)
    if extras.remote_encode is not None:
        state.metrics.bind_remote_encode(extras.remote_encode)


def create_lifespan(
    config: GatewayConfig,
    engine: EngineBase | None,
    metrics: GatewayMetrics,
    drain: Drain,
    tracer: Tracer | None = None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, State]]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, State]]:
        eng = engine if engine is not None else create_engine(config)
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0)) as http:
            state = State(
                config=config,
                engine=eng,
                metrics=metrics,
                http=http,
                media_cache=MediaCache(config.media.media_cache_bytes),
                prefill_queue=PrefillQueue(config.disagg.max_queued_prefill_tokens),
            )
            drain.bind(state)
            publishers: list[ZmqKvPublisher] = []  # --kv-events-zmq
            loading = asyncio.create_task(_load(state, publishers), name="engine-load")
            tasks = [loading]
            if metrics.mirror is not None:  # one of several API servers
                tasks.append(asyncio.create_task(_sync_counters(metrics), name="metrics-sync"))
            try:
                yield {"gateway": state}
            finally:
                drain.begin()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                metrics.sync_counters()  # what this server counted last
                await state.stop_engine()
                metrics.unbind_engine()
                for publisher in publishers:
                    publisher.close()
                logger.info("engine stopped")
                if tracer is not None:  # export the spans still queued
                    await asyncio.to_thread(tracer.shutdown)

    return lifespan
