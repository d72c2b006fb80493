"""EngineParts: what EngineCore builds around a LoadedModel once it has loaded.

The Stepper the step loop drives, the SequenceBuilder that turns requests into Sequences, the
factory of grammar matchers, and the EngineInfo the core announces. The prefix cache reports to the
core's KvEventOutbox from event 0 (an empty cache) on.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtllm_gateway.engine.builtin.config import BuiltinConfig
from trtllm_gateway.engine.builtin.loader import LoadedModel
from trtllm_gateway.engine.builtin.sampler import Sampler
from trtllm_gateway.engine.builtin.scheduler import Scheduler
from trtllm_gateway.engine.builtin.sequence_builder import SequenceBuilder
from trtllm_gateway.engine.builtin.stepper import Stepper
from trtllm_gateway.engine.guided.matcher import GuidedFactory
from trtllm_gateway.engine.image_resize import resize_edge
from trtllm_gateway.engine.kv_events.log import KvEventSink
from trtllm_gateway.engine.logits.load import LogitsProcessors
from trtllm_gateway.engine.logits.processor import ProcessorContext
from trtllm_gateway.engine.protocol import EngineHealth, EngineInfo, EngineState


@dataclass(frozen=True, slots=True)
class EngineParts:
    stepper: Stepper
    sequences: SequenceBuilder
    guided: GuidedFactory
    info: EngineInfo
    logits: LogitsProcessors

    def health(
        self, state: EngineState, detail: str = "", handoffs: tuple[int, float] = (0, 0.0)
    ) -> EngineHealth:
        """The snapshot /health and the gauges read, from the scheduler's counters; handoffs:
        the KV hand-offs begun and the step thread's seconds on them (KvHandoffs.clock)."""
        s = self.stepper.scheduler
        return EngineHealth(
            state=state,
            running=len(s.running),
            waiting=len(s.waiting),
            kv_usage=s.blocks.usage,
            kv_active_blocks=s.blocks.num_blocks - s.blocks.num_free,
            kv_total_blocks=s.blocks.num_blocks,
            preemptions=s.preemptions,
            prefix_cache_queries=s.prefix_queries,
            prefix_cache_hits=s.prefix_hits,
            kv_handoffs=handoffs[0],
            kv_handoff_step_seconds=handoffs[1],
            detail=detail,
        )


def assemble(lm: LoadedModel, config: BuiltinConfig, kv_events: KvEventSink) -> EngineParts:
    engine = config.engine
    lm.blocks.events = kv_events
    lm.blocks.dp_rank = engine.data_parallel_rank
    lm.blocks.clear_cache()  # event 0: a reader starts from an empty cache
    sched = Scheduler(lm.blocks, engine.max_batch_size, engine.max_num_tokens)
    context = ProcessorContext(
        lm.cfg.vocab_size, lm.cfg.eos_token_ids, str(lm.model_dir or ""), str(lm.device)
    )
    logits = LogitsProcessors.create(
        tuple(engine.logits_processor), context, engine.enable_test_logits_processor
    )
    sampler = Sampler(lm.cfg.eos_token_ids)
    max_held = max(1, int(engine.max_held_kv_fraction * lm.blocks.num_blocks))
    stepper = Stepper(
        lm,
        sched,
        sampler,
        lm.max_model_len,
        engine.kv_handoff_timeout,
        max_held,
        depth=engine.overlap_depth,
    )
    info = EngineInfo(
        model_id=config.model_id,
        max_model_len=lm.max_model_len,
        vocab_size=lm.cfg.vocab_size,
        eos_token_ids=lm.cfg.eos_token_ids,
        mode=engine.mode,
        kv_layout=lm.kv_layout,
        supports_images=lm.vision is not None,
        image_resize_edge=resize_edge(lm.model_dir) if lm.vision is not None else 0,
        max_batch_size=engine.max_batch_size,
    )
    guided = GuidedFactory(lm.model_dir, lm.cfg.vocab_size, lm.cfg.eos_token_ids)
    sequences = SequenceBuilder(info, lm.blocks, lm.device, engine.seed)
    return EngineParts(stepper, sequences, guided, info, logits)
