"""TrtllmEngine: the Engine protocol over TensorRT-LLM's in-process LLM API (PyTorch backend).

Requests go in as token ids (`detokenize=False`); engine/tokenizer.py detokenizes and matches
stop strings for both engines alike. `generate_async` is called on the event-loop thread, as
TensorRT-LLM requires, and each streamed step is copied into a frozen TokenEvent before the next
await (TensorRT-LLM mutates one result object in place). Our string `request_id` maps to the
engine's result through `self._inflight` (inflight.py). Every call into TensorRT-LLM runs under
errors.py's translation: `RequestError`, and anything raised while building or enqueuing one
request outside TensorRT-LLM's executor, fails that request; an exception from the executor
(its worker process gone) marks the engine dead (health 503). What 1.2's worker would die on is
refused before it gets there: at start-up (config.engine_args.refuse_for_mode, LoRA adapters in
lora.py, --encode-url in loader.py) or per request (image_embeds in multimodal.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from trtllm_gateway.config.disagg import EncodeSiblings
from trtllm_gateway.config.engine import DEFAULT_MODEL, EngineConfig
from trtllm_gateway.config.engine_args import TRTLLM_TOKENS_PER_BLOCK, resolve_trtllm_args
from trtllm_gateway.config.trtllm import TrtllmConfig
from trtllm_gateway.config.trtllm_autodeploy import (
    AUTODEPLOY_MAX_BATCH_SIZE,
    AUTODEPLOY_MAX_SEQ_LEN,
)
from trtllm_gateway.config.trtllm_schema import validated_against
from trtllm_gateway.engine.capabilities import EngineExtras
from trtllm_gateway.engine.kv_events.log import KvEventLog
from trtllm_gateway.engine.logits.load import LogitsProcessors
from trtllm_gateway.engine.model_source import model_display_name, resolve_model
from trtllm_gateway.engine.protocol import (
    EngineDeadError,
    EngineError,
    EngineHealth,
    EngineInfo,
    EngineState,
    GenerateRequest,
    InvalidRequestError,
    PrefillResult,
    Timings,
    TokenEvent,
)
from trtllm_gateway.engine.tokenizer import Tokenizer
from trtllm_gateway.engine.trtllm import disagg
from trtllm_gateway.engine.trtllm.encode import RemoteEmbeddings, embeds_layout
from trtllm_gateway.engine.trtllm.errors import ErrorTranslator, TrtllmRequestError
from trtllm_gateway.engine.trtllm.inflight import InFlight
from trtllm_gateway.engine.trtllm.kv_events import start_kv_feed
from trtllm_gateway.engine.trtllm.limits import TRTLLM_MAX_BATCH_SIZE, check_request
from trtllm_gateway.engine.trtllm.llm_args import create_llm_kwargs, select_llm_class
from trtllm_gateway.engine.trtllm.loader import (
    import_llmapi,
    import_trtllm,
    refuse_unsupported,
    set_trtllm_log_level,
)
from trtllm_gateway.engine.trtllm.logits import attach, create_processors
from trtllm_gateway.engine.trtllm.lora import LoraAdapters
from trtllm_gateway.engine.trtllm.model_info import read_engine_info
from trtllm_gateway.engine.trtllm.multimodal import image_inputs
from trtllm_gateway.engine.trtllm.outputs import map_logprobs, step_event
from trtllm_gateway.engine.trtllm.sampling import to_trtllm_sampling
from trtllm_gateway.engine.trtllm.stats import StatsPoller

logger = logging.getLogger(__name__)

__all__ = ["TrtllmEngine", "TrtllmRequestError"]  # the request error is named here too


class TrtllmEngine:
    """Engine protocol over `tensorrt_llm.LLM` (aggregated, prefill or decode mode)."""

    def __init__(
        self,
        engine: EngineConfig,
        trtllm: TrtllmConfig,
        *,
        encoders: EncodeSiblings | None = None,
        log_level: str = "info",
    ) -> None:
        """Check the install and the engine args; load nothing yet (start() does).

        Raises TrtllmNotInstalledError (one line: how to get TensorRT-LLM) or EngineArgsError
        (file, key and reason), so a bad start-up never shows a traceback. `--model default`
        or a .gguf file is converted to an HF checkpoint in start() (engine.model_source).
        """
        self._trt = import_trtllm()
        self._llmapi = import_llmapi()
        set_trtllm_log_level(log_level)
        self._errors = ErrorTranslator(self._llmapi.RequestError, self._mark_dead)
        self._config = engine
        self._encoders = encoders  # --encode-url (EPD)
        self._args = resolve_trtllm_args(engine, trtllm)
        logger.info("TensorRT-LLM args validated against %s", validated_against(self._args))
        if engine.mode == "prefill":
            logger.info(
                "--mode prefill: disable_overlap_scheduler is forced true (TensorRT-LLM 1.2's "
                "worker exits on a context-only request with the overlap scheduler on)"
            )
        self._model = str(self._args.get("model") or engine.model)
        refuse_unsupported(engine, encoders, self._model)
        self._loras = LoraAdapters.from_config(trtllm, self._args)
        self.tokenizer_dir = Path(str(self._args.get("tokenizer") or self._model))
        self.info: EngineInfo = self._read_info()
        self._llm: Any = None
        self._state: EngineState = "loading"
        self._detail = ""
        self._inflight = InFlight()
        self._stats: StatsPoller | None = None
        self._text_tokenizer: Tokenizer | None = None
        self._remote_encode: RemoteEmbeddings | None = None  # --encode-url (EPD)
        self._layout = ""  # embed_wire layout of this model's embeddings (image_embeds, EPD)
        # KvEventSource: TensorRT-LLM's KV events, converted by engine/trtllm/kv_events.py
        self.kv_event_log = KvEventLog(block_size=0, enabled=False)
        self._kv_feed: asyncio.Task[None] | None = None
        self._logits = LogitsProcessors(())  # --logits-processor, built in start()

    @property
    def extras(self) -> EngineExtras:
        remote = self._remote_encode
        outcomes = remote.remote.stats.outcomes if remote is not None else None
        return EngineExtras(tokenizer_dir=self.tokenizer_dir, remote_encode=outcomes)

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Build the LLM (blocking: weights, autotune, CUDA graphs) and start the stats pollers.

        Built on the event-loop thread before serving begins, as trtllm-serve does.
        Raises EngineDeadError if TensorRT-LLM cannot start.
        """
        try:
            if _needs_conversion(self._model):
                await self._convert_model()
            self._llm = self._create_llm()
        except Exception as exc:
            self._mark_dead(exc)
            raise EngineDeadError(f"TensorRT-LLM failed to start: {exc}") from exc
        self._fill_eos_from_tokenizer()
        self._logits = create_processors(self._config, self.info, self.tokenizer_dir)
        if self._encoders is not None:
            self._remote_encode = RemoteEmbeddings(self._encoders, Path(self._model))
        kv_events = bool(self._args.get("kv_cache_config", {}).get("event_buffer_max_size"))
        self._stats = StatsPoller(self._llm, kv_events=kv_events)
        self._stats.start()
        if kv_events:
            self.kv_event_log.enabled = True
            block = self._args.get("kv_cache_config", {}).get("tokens_per_block")
            self._kv_feed = start_kv_feed(
                self.kv_event_log,
                self.kv_events(),
                block or TRTLLM_TOKENS_PER_BLOCK,
                self._config.data_parallel_rank,
            )
        self._state = "ready"
        logger.info("TensorRT-LLM engine ready: %s (%s mode)", self._model, self._config.mode)

    async def stop(self) -> None:
        """Abort everything in flight, stop the pollers, shut TensorRT-LLM down (its workers)."""
        self._state = "draining"
        self._inflight.abort_all()  # quiet when the executor is gone already (dead worker)
        if self._kv_feed is not None:
            self._kv_feed.cancel()
        if self._stats is not None:
            await self._stats.stop()
        await self._inflight.wait_drained()
        if self._remote_encode is not None:
            await self._remote_encode.aclose()
        if self._llm is not None:
            await asyncio.to_thread(self._llm.shutdown)
            self._llm = None
        self._state = "dead"
        self._detail = "stopped"

    def health(self) -> EngineHealth:
        """Cheap snapshot from the last iteration stats (see engine.trtllm.stats).

        The stats lag a request just submitted, so the requests in flight count too, but as
        TensorRT-LLM schedules them: at most max_batch_size run, the rest wait in its queue.
        """
        snap = self._stats.snapshot if self._stats is not None else None
        inflight = len(self._inflight)
        running = min(inflight, self.info.max_batch_size or inflight)
        if snap is None:
            return EngineHealth(
                state=self._state, running=running, waiting=inflight - running, detail=self._detail
            )
        running = max(snap.running, running)
        return EngineHealth(
            state=self._state,
            running=running,
            waiting=max(snap.waiting, inflight - running),
            kv_usage=snap.kv_usage,
            kv_active_blocks=snap.kv_active_blocks,
            kv_total_blocks=snap.kv_total_blocks,
            prefix_cache_queries=snap.prefix_cache_queries,
            prefix_cache_hits=snap.prefix_cache_hits,
            detail=self._detail,
        )

    # -- requests ---------------------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """Stream TokenEvents; closing or cancelling the iterator aborts the request.

        With req.disagg (generation_only), the KV cache comes from the prefill sibling named in
        its opaque state and the first event repeats the sibling's first token(s).
        """
        self._require_ready()
        check_request(req, self.info, self._args)
        state = None
        if req.disagg is not None and req.disagg.request_type == "generation_only":
            disagg.refuse_logprobs(req)
            state = disagg.unpack_context(req.disagg)
            if state.finish_reason not in (None, "not_finished", "length"):
                yield disagg.finished_event(req, state)  # e.g. the end id came first
                return
        sp = self._sampling(req)
        params = disagg.to_generation_only(self._llmapi, state) if state else None
        inputs = await self._inputs(req)
        result = self._submit(req, sp, inputs, streaming=True, params=params)
        finished = False
        started = time.monotonic()
        first_token_at: float | None = None
        try:
            first = True
            steps = aiter(result)
            with self._errors.translated(one_request=True):
                while True:
                    try:
                        step = await self._inflight.wait(req.request_id, anext(steps))
                    except StopAsyncIteration:
                        break
                    event = step_event(
                        step,
                        prompt_tokens=len(req.prompt_token_ids),
                        logprobs_k=req.sampling.logprobs,
                        prompt_logprobs_k=req.sampling.prompt_logprobs,
                        first=first,
                        end_id=sp.end_id,
                    )
                    if event is None:
                        continue
                    first = False
                    if first_token_at is None and event.token_ids:
                        first_token_at = time.monotonic()
                    if event.finish_reason is not None:
                        finished = True
                        event = msgspec.structs.replace(
                            event, timings=_timings(started, first_token_at)
                        )
                    yield event
                    if finished:
                        return
        except EngineError:
            finished = True  # TensorRT-LLM ended the request itself: nothing left to abort
            raise
        finally:
            self._release(req.request_id, result, finished)

    async def prefill(self, req: GenerateRequest) -> PrefillResult:
        """Context-only phase (max_tokens forced to 1 on a fresh SamplingParams). The result's
        opaque_state is engine.trtllm.disagg JSON bytes; cancelling aborts the request.
        """
        self._require_ready()
        if self._args.get("cache_transceiver_config") is None:
            raise InvalidRequestError("this instance has no KV cache transceiver (--mode prefill)")
        check_request(req, self.info, self._args)
        sp = self._sampling(req, max_tokens=1)
        params = disagg.to_context_only(self._llmapi, req.disagg)
        inputs = await self._inputs(req)
        result = self._submit(req, sp, inputs, streaming=False, params=params)
        out = await self._await_result(req.request_id, result)
        comp = out.outputs[0]
        ctx = comp.disaggregated_params or self._llmapi.DisaggregatedParams(
            request_type="context_only",
            first_gen_tokens=list(comp.token_ids),
            ctx_request_id=out.request_id,
        )
        first_ids = tuple(int(t) for t in (ctx.first_gen_tokens or comp.token_ids))
        k = req.sampling.logprobs
        return PrefillResult(
            request_id=req.request_id,
            first_token_ids=first_ids,
            first_logprobs=map_logprobs(comp.logprobs, first_ids, k) if k is not None else None,
            prompt_tokens=len(req.prompt_token_ids),
            cached_tokens=int(getattr(out, "cached_tokens", 0) or 0),
            opaque_state=disagg.pack_context(ctx, comp.finish_reason),
        )

    def abort(self, request_id: str) -> None:
        """Idempotent: ask TensorRT-LLM to cancel; the stream then ends with 'abort'.

        Never raises: after stop() TensorRT-LLM's executor is gone and stop() aborted it all.
        """
        if self._llm is not None:
            self._inflight.abort(request_id)

    async def kv_events(self) -> AsyncIterator[dict[str, Any]]:
        """KV-cache events (TensorRT-LLM's dicts) for KV-aware routers; needs --enable-kv-events."""
        if self._stats is None:
            return
        async for event in self._stats.kv_events():
            yield event

    # -- helpers ----------------------------------------------------------------------------
    def _read_info(self) -> EngineInfo:
        # max_batch_size from the layered args (a YAML or --override may change the flag's
        # value), else the LlmArgs' own default: what TensorRT-LLM will actually run.
        # AutoDeploy's differ from TorchLlmArgs' (config/trtllm_autodeploy.py).
        autodeploy = self._args.get("backend") in ("autodeploy", "_autodeploy")
        default_batch = AUTODEPLOY_MAX_BATCH_SIZE if autodeploy else TRTLLM_MAX_BATCH_SIZE
        batch = int(self._args.get("max_batch_size") or default_batch)
        max_seq_len = self._args.get("max_seq_len")
        if autodeploy and max_seq_len is None:
            max_seq_len = AUTODEPLOY_MAX_SEQ_LEN
        if _needs_conversion(self._model):  # known after start() converts it
            return EngineInfo(
                model_id=self._model,
                max_model_len=0,
                vocab_size=0,
                eos_token_ids=(),
                mode=self._config.mode,
                engine="trtllm",
                max_batch_size=batch,
                lora_names=self._loras.names,
            )
        info = read_engine_info(
            self._model,
            served_name=self._config.served_model_name,
            mode=self._config.mode,
            max_seq_len=max_seq_len,
            trust_remote_code=bool(self._args.get("trust_remote_code")),
            kv_cache=self._args.get("kv_cache_config"),
        )
        return dataclasses.replace(info, max_batch_size=batch, lora_names=self._loras.names)

    async def _convert_model(self) -> None:
        """'default' or a .gguf file: TensorRT-LLM reads HF checkpoints, so convert (cached)."""
        path = await asyncio.to_thread(resolve_model, self._model, self._config.cache_dir)
        served = self._config.served_model_name or model_display_name(self._model, path)
        self._model = str(path)
        refuse_unsupported(self._config, self._encoders, self._model)  # its config.json is known
        self._args = {**self._args, "model": self._model}
        if not self._args.get("tokenizer"):
            self.tokenizer_dir = path
        self.info = dataclasses.replace(self._read_info(), model_id=served)

    def _create_llm(self) -> Any:
        backend, kwargs = create_llm_kwargs(self._llmapi, self._args)
        return select_llm_class(backend)(**kwargs)

    def _submit(
        self, req: GenerateRequest, sp: Any, inputs: dict[str, Any], *, streaming: bool, params: Any
    ) -> Any:
        if req.request_id in self._inflight:
            raise InvalidRequestError(f"request_id {req.request_id!r} is already running")
        lora = self._loras.request(self._llmapi, req.lora_name)
        if "prompt" in inputs:
            sp.add_special_tokens = False  # the decoded prompt already has them
        # A bad parameter generate_async rejects is the request's fault, not the engine's.
        with self._errors.translated(invalid=(ValueError, TypeError)):
            result = self._llm.generate_async(
                inputs,
                sampling_params=sp,
                lora_request=lora,
                streaming=streaming,
                disaggregated_params=params,
                # Our span's W3C context: TensorRT-LLM's own spans (its otlp_traces_endpoint)
                # become its children.
                trace_headers=dict(req.trace_headers) or None,
            )
        logger.debug("request %s is TensorRT-LLM request %s", req.request_id, result.request_id)
        self._inflight.add(req.request_id, result)
        if self._stats is not None:
            self._stats.request_submitted()
        return result

    async def _await_result(self, request_id: str, result: Any) -> Any:
        done = False
        try:
            with self._errors.translated(one_request=True):
                out = await self._inflight.wait(request_id, result)
            done = True
            return out
        except EngineError:
            done = True  # TensorRT-LLM ended the request itself: nothing left to abort
            raise
        finally:
            self._release(request_id, result, done)

    async def _inputs(self, req: GenerateRequest) -> dict[str, Any]:
        """Token ids, or for images a TextPrompt (engine.trtllm.multimodal) with the images or,
        from an encode sibling (--encode-url), their embeddings."""
        if not req.images:
            return {"prompt_token_ids": list(req.prompt_token_ids)}
        if self._text_tokenizer is None:
            self._text_tokenizer = Tokenizer.from_dir(self.tokenizer_dir)
        if not self._layout:
            self._layout = embeds_layout(Path(self._model))
        return await image_inputs(req, self._text_tokenizer, self._remote_encode, self._layout)

    def _release(self, request_id: str, result: Any, finished: bool) -> None:
        """Forget a request; one given up early is aborted and drained unless stop() already
        shut TensorRT-LLM down (it aborted everything first)."""
        self._inflight.release(request_id, result, finished=finished, alive=self._llm is not None)

    def _require_ready(self) -> None:
        if self._state != "ready" or self._llm is None:
            raise EngineDeadError(f"TensorRT-LLM engine is {self._state}: {self._detail}".rstrip())

    def _sampling(self, req: GenerateRequest, max_tokens: int | None = None) -> Any:
        end_id = self._end_id()
        sp = to_trtllm_sampling(
            self._trt,
            req.sampling,
            end_id=end_id,
            hidden_stop_ids=self.info.eos_token_ids[1:],
            max_tokens=max_tokens,
            vocab_size=self.info.vocab_size,
            guided_backend=self._args.get("guided_decoding_backend"),
        )
        return attach(sp, self._logits, req)

    def _end_id(self) -> int:
        if not self.info.eos_token_ids:
            raise InvalidRequestError("the model has no end-of-sequence token id")
        return self.info.eos_token_ids[0]

    def _fill_eos_from_tokenizer(self) -> None:
        tokenizer = getattr(self._llm, "tokenizer", None)
        eos = getattr(tokenizer, "eos_token_id", None)
        if not self.info.eos_token_ids and isinstance(eos, int):
            self.info = dataclasses.replace(self.info, eos_token_ids=(eos,))

    def _mark_dead(self, exc: BaseException) -> None:
        logger.error("TensorRT-LLM engine is dead: %r", exc)
        self._state = "dead"
        self._detail = f"{type(exc).__name__}: {exc}"
        self._inflight.fail_waiting(self._detail)  # their results will never answer


def _needs_conversion(model: str) -> bool:
    return model == DEFAULT_MODEL or model.endswith(".gguf")


def _timings(started: float, first_token_at: float | None) -> Timings:
    now = time.monotonic()
    first = first_token_at if first_token_at is not None else now
    return Timings(queue_s=0.0, prefill_s=first - started, decode_s=now - first)
