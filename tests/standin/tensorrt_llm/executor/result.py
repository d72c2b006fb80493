"""Stand-in `tensorrt_llm.executor.result`: the in-place mutating streaming result (§2.3, §2.4)."""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensorrt_llm import _logits_hook, _scripted
from tensorrt_llm.disaggregated_params import DisaggregatedParams
from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.utils import RequestError
from tensorrt_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from tensorrt_llm._guided import Guide
    from tensorrt_llm.llmapi.llm import LLM

FLAT_LOGPROBS = False
"""Set True to get the legacy flat `list[float]` logprobs form instead of dicts."""

_NO_LOOP = (
    "The asyncio event loop was not present during initialization, so async operations "
    "are not available."
)


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[Any] = field(default_factory=list)
    prompt_logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generation_logits: Any = None
    disaggregated_params: DisaggregatedParams | None = None
    request_perf_metrics: Any = None
    _last_token_ids_len: int = 0
    _last_logprobs_len: int = 0
    _last_text_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[Any]:
        return self.logprobs[self._last_logprobs_len :]


class RequestOutput:
    """One request's result; every streamed step returns this same object, mutated."""

    def __init__(
        self,
        llm: LLM,
        request_id: int,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        streaming: bool,
        disaggregated_params: DisaggregatedParams | None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt: str | None = None
        self.prompt_token_ids = prompt_token_ids
        self.outputs = [CompletionOutput(index=0)]
        self.finished = False
        self.cached_tokens = 0
        self.context_logits = None
        self.mm_embedding_handle: dict[str, Any] | None = None
        self.metrics_dict: dict[Any, Any] = {}
        self.decoding_iter = 0
        self.disaggregated_params = disaggregated_params
        self.lora_request = lora_request
        # The adapter changes the "model": its id salts the token choice.
        self._key_ids = (
            [-lora_request.adapter_id, *prompt_token_ids] if lora_request else prompt_token_ids
        )
        self._llm = llm
        self._sp = sampling_params
        self._streaming = streaming
        self._aborted = False
        self._reported_final = False
        self._position = 0
        self._guide: Guide | None = None
        # The worker's copies of sampling_params.logits_processor (_logits_hook.to_worker).
        self.logits_post_processors: list[Any] = []
        self._failed: str | None = None  # PyExecutor._handle_errors failed it with this
        self._has_loop = _has_event_loop()
        self._delay = float(os.environ.get("TRTLLM_STANDIN_STEP_DELAY_S", "0") or 0)
        dp = disaggregated_params
        self._context_only = dp is not None and dp.request_type == "context_only"
        self._generation_only = dp is not None and dp.request_type == "generation_only"
        if self._generation_only and dp is not None:
            # The KV cache arrives from the context worker, with its first token.
            self.outputs[0].token_ids = list(dp.first_gen_tokens or [])
            self._position = len(self.outputs[0].token_ids)

    # -- public API -----------------------------------------------------------------------
    def abort(self) -> None:
        # Real (tensorrt_llm/executor/result.py, GenerationResult.abort): it calls
        # `self._executor().abort_request(self.request_id)` with no check of `finished`; the
        # result holds only a weakref to the executor, which LLM.shutdown() drops, so after
        # shutdown the call fails on None, finished or not.
        if self._llm._shutdown:
            raise AttributeError("'NoneType' object has no attribute 'abort_request'")
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        assert self._has_loop, _NO_LOOP
        if self._reported_final:
            raise StopAsyncIteration
        await self._wait_for_a_slot()
        self._step()
        self._reported_final = self.finished
        return self

    async def _wait_for_a_slot(self) -> None:
        # The capacity scheduler runs at most max_batch_size requests in a step; the rest wait
        # in the queue (numQueuedRequests) until one finishes. A queued abort is served.
        await asyncio.sleep(self._delay)
        while True:
            if self.finished or self._failed is not None:
                return
            if self._llm._executor.worker_died:
                # Real (executor/worker.py worker_main, 1.2 window): once the worker has ended
                # it tells the proxy's result threads to quit; a request in flight gets no
                # further response, and reading it waits for ever.
                await asyncio.Event().wait()
            if self._aborted or self._llm._scheduled(self):
                return
            await asyncio.sleep(max(self._delay, 0.001))

    async def aresult(self) -> RequestOutput:
        assert self._has_loop, _NO_LOOP
        while not self.finished:
            await self._wait_for_a_slot()
            self._step()
        self._reported_final = True
        return self

    def __await__(self) -> Generator[Any, None, RequestOutput]:
        return self.aresult().__await__()

    def result(self, timeout: float | None = None) -> RequestOutput:
        while not self.finished:
            self._step()
        return self

    # -- the scripted engine step ----------------------------------------------------------
    def _step(self) -> None:
        self._advance()
        out = self.outputs[0]
        if self._sp.logprobs and out.finish_reason != "cancelled":
            # Real (executor/result.py, GenerationResultBase._handle_sequence, 1.2 period):
            # "overcome some WAR in the cpp executor" -- on every non-cancelled response
            # `assert len(output.logprobs) == output.length`. A generation-only request's
            # token_ids start with first_gen_tokens, which the context side produced and
            # py_executor's _prepare_disagg_gen_transmission_complete adds without a logprob,
            # so the assertion fails inside the caller's `async for`.
            assert len(out.logprobs) == len(out.token_ids)

    def _advance(self) -> None:
        out = self.outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        out._last_logprobs_len = len(out.logprobs)
        out._last_text_len = len(out.text)
        if self.decoding_iter == 0 and self._generation_only:
            out._last_token_ids_len = 0  # the first diff carries first_gen_tokens
        if self.finished:
            return
        if self._failed is not None:
            self.finished = True
            self._llm._on_finish(self)
            raise RequestError(self._failed)
        if self.decoding_iter == 0:
            self._first_step()
        self.decoding_iter += 1
        if self._aborted:
            self._finish("cancelled", None)
            return
        sp = self._sp
        generated = self._position  # counts first_gen_tokens on the generation-only side
        self._position += 1
        token = _scripted.token_at(self._key_ids, generated, self._llm._vocab_size)
        past_min = generated >= (sp.min_tokens or 0)
        if (
            not sp.ignore_eos
            and past_min
            and self._llm._turn_end is not None
            and generated == _scripted.natural_length(self._key_ids)
        ):
            # The model ends its turn with its own end-of-turn id; only end_id or a
            # stop_token_ids entry stops it (executor: end_id / stop words), else it runs on.
            token = int(self._llm._turn_end)
        if self.logits_post_processors:  # on the forward pass's logits, before the sampler
            token = self._post_process(token, out.token_ids)
        if sp.embedding_bias is not None:
            token = _scripted.biased(token, sp.embedding_bias.squeeze(0).tolist())
        if self._guide is not None:
            token = self._guide.pick(token)  # the grammar's bitmask on the logits
        if token == sp.end_id and not sp.ignore_eos:
            # Real (executor/result.py, _handle_sequence): FinishReason.END_ID sets
            # finish_reason 'stop' and leaves stop_reason None; only STOP_WORDS (stop_token_ids
            # among them) set stop_reason, to the matched id.
            self._finish("stop", None)
            return
        if past_min and token in (sp.stop_token_ids or ()):
            if sp.include_stop_str_in_output:
                self._append(token, generated)
            self._finish("stop", token)
            return
        self._append(token, generated)
        if self._guide is not None:
            self._guide.accept(token)
        if self._context_only:
            self._finish_context(token)
        elif len(out.token_ids) >= sp.max_tokens:
            self._finish("length", None)
        self._llm._on_step(self)

    def _post_process(self, token: int, output_ids: list[int]) -> int:
        try:
            return _logits_hook.post_process(
                self.logits_post_processors,
                self.request_id,
                token,
                [*self.prompt_token_ids, *output_ids],
                self._llm._vocab_size,
            )
        except Exception as e:  # the forward step failed: PyExecutor._handle_errors
            self._llm._fail_all(f"{type(e).__name__}: {e}")
            self.finished = True
            self._llm._on_finish(self)
            raise RequestError(str(e)) from e

    def _first_step(self) -> None:
        vocab = self._llm._vocab_size
        if any(not 0 <= t < vocab for t in self.prompt_token_ids):
            # Real (1.2 window): llmapi/llm.py generate_async passes prompt_token_ids through
            # unchecked (_check_arguments checks only the length on the PyTorch backend), so an
            # id past the vocabulary reaches the embedding lookup on the GPU: a device-side
            # assert, after which the CUDA context is unusable. Harsher reading taken: the
            # forward step fails every active request (PyExecutor._handle_errors) and the
            # worker is gone (executor/worker.py: the next submit finds no worker).
            why = f"CUDA error: device-side assert triggered (prompt token id outside [0, {vocab}))"
            self._llm._fail_all(why)
            self._llm._executor.worker.died = Exception(f"Failed during generation: {why}")
            self.finished = True
            self._llm._on_finish(self)
            raise RequestError(why)
        if self._generation_only:
            dp = self.disaggregated_params
            assert dp is not None
            expected = _scripted.opaque_state(self.prompt_token_ids, dp.ctx_request_id or -1)
            if dp.opaque_state != expected:
                self.finished = True
                self._llm._on_finish(self)
                raise RequestError("KV cache transfer failed: context state does not match")
        else:
            lora_id = self.lora_request.adapter_id if self.lora_request else None
            self.cached_tokens = self._llm._reuse_prefix(
                self.request_id, self.prompt_token_ids, lora_id
            )
        if self._sp.guided_decoding is not None and self._llm._guided is not None:
            self._guide = self._llm._guided.start(self._sp.guided_decoding, self._sp.end_id or 0)
            for token in self.outputs[0].token_ids:  # first_gen_tokens, generation-only side
                self._guide.accept(token)
        if self._sp.prompt_logprobs:  # 0 is falsy: "no prompt logprobs" (_get_output_config)
            # One top-k dict per context position; entry t is the distribution after token t
            # (so it scores token t+1), built from context logits with no target token: the
            # actual next token is there only if it is in the top k (executor/result.py).
            k = self._sp.prompt_logprobs
            vocab = self._llm._vocab_size
            prompt = self.prompt_token_ids
            self.outputs[0].prompt_logprobs = [
                {
                    tid: Logprob(lp, rank)
                    for rank, (tid, lp) in enumerate(_scripted.prompt_topk(prompt, t, k, vocab), 1)
                }
                for t in range(len(prompt))
            ]

    def _append(self, token: int, position: int) -> None:
        out = self.outputs[0]
        out.token_ids.append(token)
        if self._sp.logprobs:  # logprobs=0 returns none: TensorRT-LLM tests it for truth
            entry = self._logprob_entry(token, position, self._sp.logprobs)
            out.logprobs.append(entry)
            chosen = entry if isinstance(entry, float) else entry.get(token)
            if chosen is not None:
                value = chosen if isinstance(chosen, float) else chosen.logprob
                out.cumulative_logprob = (out.cumulative_logprob or 0.0) + value

    def _logprob_entry(self, token: int, position: int, k: int) -> Any:
        # Real (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/sampler.py, 1.2 period):
        # TorchSampler._process_requests takes `torch.topk(log_softmax(logits),
        # k=max(py_num_logprobs))` of the raw logits and handle_logprobs stores exactly those k
        # {token: Logprob(value, rank)} per step; the sampled token is NOT added when it falls
        # outside the top k (later versions add it). Under sampling it often does.
        rank = _scripted.sampled_rank(token, position, _greedy(self._sp))
        if FLAT_LOGPROBS:  # the legacy form: the sampled token's own value
            return _scripted.logprob_at(token, position, rank)
        entry: dict[int, Logprob] = {}
        for r in range(1, k + 1):
            tid = token if r == rank else (token + 7 * r + 1) % self._llm._vocab_size
            if tid in entry or (tid == token and r != rank):
                tid = (tid + 1) % self._llm._vocab_size
            entry[tid] = Logprob(_scripted.logprob_at(token, position, r), rank=r)
        return entry

    def _finish_context(self, token: int) -> None:
        out = self.outputs[0]
        out.disaggregated_params = DisaggregatedParams(
            request_type="context_only",
            first_gen_tokens=[token],
            ctx_request_id=self.request_id,
            opaque_state=_scripted.opaque_state(self.prompt_token_ids, self.request_id),
            draft_tokens=None,
        )
        self._finish("not_finished", None)

    def _finish(self, reason: str, stop_reason: int | str | None) -> None:
        out = self.outputs[0]
        out.finish_reason = reason
        out.stop_reason = stop_reason
        self.finished = True
        self._llm._on_finish(self)


class IterationResult:
    """Shared stats / KV-event iterator: ends after `timeout` without data; re-armed per request."""

    def __init__(self) -> None:
        self._queue: deque[dict[str, Any]] = deque(maxlen=1000)
        self._done = False
        self.timeout = 2.0

    def put(self, item: dict[str, Any]) -> None:
        self._queue.append(item)

    def mark_undone(self) -> None:
        self._done = False

    def __aiter__(self) -> IterationResult:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._done:
            raise StopAsyncIteration
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while not self._queue:
            if loop.time() >= deadline:
                self._done = True
                raise StopAsyncIteration
            await asyncio.sleep(0.01)
        return self._queue.popleft()


def _greedy(sp: SamplingParams) -> bool:
    """SamplingParams.params_imply_greedy_decoding (sampling_params.py): temperature 0, top_k 1
    or top_p 0, or no sampling knob set at all."""
    if sp.temperature is None and sp.top_p is None and sp.top_k is None:
        return True
    return sp.temperature == 0 or sp.top_k == 1 or sp.top_p == 0.0


def _has_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
