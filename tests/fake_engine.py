"""FakeEngine: a test double of the Engine protocol, with scripted tokens, delays and failures.

The api tests serve it through create_app(config, engine=fake) (tests/conftest.py); it is no part
of the package. It keeps the protocol's contract: closing generate() early aborts the request
(recorded in `aborted`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from trtllm_gateway.engine.capabilities import EngineExtras
from trtllm_gateway.engine.protocol import (
    ContextTooLongError,
    EngineDeadError,
    EngineError,
    EngineHealth,
    EngineInfo,
    EngineState,
    FinishReason,
    GenerateRequest,
    PrefillResult,
    Timings,
    TokenEvent,
    TokenLogprob,
    Usage,
)

Script = Sequence[int] | Callable[[GenerateRequest], Sequence[int]]
FAKE_REPLY = "Hello from the fake engine."


class FakeEngine:
    """Replies with `script` (then EOS), one token per event.

    With a seed, the script is rotated by the seed so that n>1 choices differ. Logprobs are
    synthetic: the chosen token is the best alternative, and the last of several alternatives is
    -inf so that clients see the clamp.
    """

    def __init__(
        self,
        info: EngineInfo,
        script: Script = (),
        *,
        tokens_per_event: int = 1,
        delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
        load_delay_s: float = 0.0,
        fail_on_generate: EngineError | None = None,
        fail_after_tokens: int | None = None,
        fail_with: EngineError | None = None,
        cached_tokens: int = 0,
        tokenizer_dir: Path | None = None,
    ) -> None:
        self.info = info
        self.script = script
        self.tokens_per_event = tokens_per_event
        self.delay_s = delay_s
        self.first_token_delay_s = first_token_delay_s
        self.load_delay_s = load_delay_s
        self.fail_on_generate = fail_on_generate
        self.fail_after_tokens = fail_after_tokens
        self.fail_with = fail_with or EngineDeadError("fake engine failure")
        self.cached_tokens = cached_tokens
        self.tokenizer_dir = tokenizer_dir
        self.state: EngineState = "loading"
        self.requests: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self._running: dict[str, asyncio.Event] = {}

    @property
    def extras(self) -> EngineExtras:
        return EngineExtras(tokenizer_dir=self.tokenizer_dir)

    async def start(self) -> None:
        await asyncio.sleep(self.load_delay_s)
        if not self.script and self.tokenizer_dir is not None:
            self.script = await asyncio.to_thread(self._reply_from_tokenizer, self.tokenizer_dir)
        self.state = "ready"

    def _reply_from_tokenizer(self, path: Path) -> list[int]:
        from trtllm_gateway.engine.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_dir(path)
        if not self.info.vocab_size:
            eos = tokenizer.eos_token_id
            self.info = EngineInfo(
                model_id=self.info.model_id,
                max_model_len=self.info.max_model_len,
                vocab_size=tokenizer.vocab_size,
                eos_token_ids=() if eos is None else (eos,),
                engine="fake",
            )
        return tokenizer.encode(FAKE_REPLY, add_special_tokens=False)

    async def stop(self) -> None:
        for request_id in list(self._running):
            self.abort(request_id)
        self.state = "dead"

    def health(self) -> EngineHealth:
        return EngineHealth(state=self.state, running=len(self._running), kv_usage=0.0)

    def _tokens(self, req: GenerateRequest) -> list[int]:
        script = list(self.script(req) if callable(self.script) else self.script)
        if req.sampling.seed and script:
            shift = req.sampling.seed % len(script)
            script = script[shift:] + script[:shift]
        return script

    def _logprob(self, token_id: int, k: int | None, step: int) -> TokenLogprob:
        value = -0.25 * (step % 4)
        top = [(token_id, value)] + [
            ((token_id + j) % max(self.info.vocab_size, 1), value - j) for j in range(1, k or 0)
        ]
        if len(top) > 2:
            top[-1] = (top[-1][0], float("-inf"))
        return TokenLogprob(token_id, value, tuple(top[: k or 0]))

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        if self.fail_on_generate is not None:
            raise self.fail_on_generate
        if self.state != "ready":
            raise EngineDeadError(f"fake engine is {self.state}")
        prompt_len = len(req.prompt_token_ids)
        if prompt_len + req.sampling.max_tokens > self.info.max_model_len:
            raise ContextTooLongError(prompt_len, req.sampling.max_tokens, self.info.max_model_len)
        self.requests.append(req)
        aborted = self._running[req.request_id] = asyncio.Event()
        try:
            await asyncio.sleep(self.first_token_delay_s)
            async for event in self._events(req, aborted):
                yield event
            self.finished.append(req.request_id)
        except (asyncio.CancelledError, GeneratorExit):
            self.abort(req.request_id)
            raise
        finally:
            self._running.pop(req.request_id, None)

    async def _events(
        self, req: GenerateRequest, aborted: asyncio.Event
    ) -> AsyncIterator[TokenEvent]:
        sp = req.sampling
        script = self._tokens(req)
        eos = self.info.eos_token_ids
        produced: list[int] = []
        pending: list[int] = []
        finish: FinishReason | None = None
        stop_token: int | None = None
        step = 0
        prompt_lps = None
        if sp.prompt_logprobs is not None:
            prompt_lps = tuple(
                self._logprob(t, sp.prompt_logprobs, i)
                for i, t in enumerate(req.prompt_token_ids[1:])
            )
        while finish is None:
            if aborted.is_set():
                finish = "abort"
                break
            if self.fail_after_tokens is not None and len(produced) >= self.fail_after_tokens:
                raise self.fail_with
            if step < len(script):
                token = script[step]
            elif sp.ignore_eos or not eos:
                token = script[step % len(script)] if script else 0
            else:
                token = eos[0]
            step += 1
            produced.append(token)
            pending.append(token)
            is_eos = token in eos and not sp.ignore_eos and len(produced) >= sp.min_tokens
            if token in sp.stop_token_ids or is_eos:
                finish, stop_token = "stop", token
            elif len(produced) >= sp.max_tokens:
                finish = "length"
            if finish is None and len(pending) < self.tokens_per_event:
                continue
            yield self._event(req, pending, step, finish, stop_token, prompt_lps)
            prompt_lps = None
            pending = []
            if finish is None:
                await asyncio.sleep(self.delay_s)
        if pending or finish == "abort":
            yield self._event(req, pending, step, finish, stop_token, prompt_lps)

    def _event(
        self,
        req: GenerateRequest,
        tokens: list[int],
        step: int,
        finish: FinishReason | None,
        stop_token: int | None,
        prompt_lps: tuple[TokenLogprob, ...] | None,
    ) -> TokenEvent:
        k = req.sampling.logprobs
        first = step - len(tokens)
        logprobs = (
            tuple(self._logprob(t, k, first + i) for i, t in enumerate(tokens))
            if k is not None
            else None
        )
        usage = None
        if finish is not None:
            cached = min(self.cached_tokens, len(req.prompt_token_ids))
            usage = Usage(len(req.prompt_token_ids), step, cached)
        return TokenEvent(
            token_ids=tuple(tokens),
            logprobs=logprobs,
            finish_reason=finish,
            stop_token_id=stop_token,
            usage=usage,
            timings=Timings() if finish is not None else None,
            prompt_logprobs=prompt_lps,
        )

    async def prefill(self, req: GenerateRequest) -> PrefillResult:
        script = self._tokens(req)
        return PrefillResult(
            request_id=req.request_id,
            first_token_ids=tuple(script[:1]),
            first_logprobs=None,
            prompt_tokens=len(req.prompt_token_ids),
            cached_tokens=0,
            opaque_state=b"",
        )

    def abort(self, request_id: str) -> None:
        event = self._running.get(request_id)
        if event is not None and not event.is_set():
            event.set()
            self.aborted.append(request_id)
