"""TensorRT-LLM 1.2 KV event dicts -> our events, alone and through TrtllmEngine on the stand-in."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.standin import ensure_on_path
from trtllm_gateway.engine.capabilities import KvEventSource
from trtllm_gateway.engine.kv_events.log import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventLog,
)
from trtllm_gateway.engine.protocol import GenerateRequest, SamplingParams
from trtllm_gateway.engine.trtllm.kv_events import TrtllmKvEvents

ensure_on_path()

from tests.configs import trtllm_engine  # noqa: E402

BIG = 2**64 - 5  # an unsigned 64-bit hash above 2**63: -5 as signed


def _stored(parent: int | None, hashes: list[int], window: int = 4096) -> dict[str, object]:
    return {
        "event_id": 2,
        "window_size": window,
        "data": {
            "type": "stored",
            "parent_hash": parent,
            "blocks": [
                {
                    "type": "stored_block",
                    "block_hash": h,
                    "tokens": [
                        {"type": "unique_token", "token_id": 10 * i + k, "token_extra_id": 0}
                        for k in range(2)
                    ],
                    "cache_level": 0,
                    "priority": 35,
                }
                for i, h in enumerate(hashes)
            ],
        },
    }


def test_a_blocks_lora_id_is_not_read() -> None:
    """Issue 35 item 5: 1.2's KVCacheEventSerializer (tensorrt_llm/_utils.py,
    `_stored_block_to_json`) leaves lora_id out (a TODO) and Dynamo's TensorRT-LLM publisher
    (components/src/dynamo/trtllm/publisher.py `_handle_kv_event`) never passes one, so the
    events are keyed without it even where a block carries one (a later serializer)."""
    raw = _stored(None, [7])
    raw["data"]["blocks"][0]["lora_id"] = 3  # type: ignore[index]
    event = TrtllmKvEvents(KvEventLog(0), block_size=2).convert(raw)
    assert isinstance(event, BlockStored)
    assert event.lora_id is None


def test_convert_each_kind() -> None:
    feed = TrtllmKvEvents(KvEventLog(0), block_size=2)
    created = {
        "event_id": 0,
        "window_size": 4096,
        "data": {"type": "created", "num_blocks_per_cache_level": [128, 0]},
    }
    assert feed.convert(created) == AllBlocksCleared()
    assert feed.log.num_blocks == 128 and feed.window == 4096
    assert feed.convert(_stored(BIG, [7, BIG])) == BlockStored(
        block_hashes=(7, -5), parent_block_hash=-5, token_ids=(0, 1, 10, 11), block_size=2
    )
    assert feed.log.block_size == 2
    assert feed.convert(_stored(None, [3]))
    removed = {
        "event_id": 3,
        "window_size": 4096,
        "data": {"type": "removed", "block_hashes": [BIG]},
    }
    assert feed.convert(removed) == BlockRemoved((-5,))
    updated = {
        "event_id": 4,
        "window_size": 4096,
        "data": {
            "type": "updated",
            "block_hash": 7,
            "priority": {"type": "event_diff", "new_value": 1, "old_value": 35},
        },
    }
    assert feed.convert(updated) is None
    # A sliding-window layer's events (a smaller window than announced) are not the router's.
    assert feed.convert(_stored(None, [9], window=512)) is None
    feed.feed({"data": {"type": "stored", "blocks": [{"tokens": []}]}})  # unreadable: logged
    assert feed.log.next_id == 0


async def test_engine_publishes_converted_events(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000,
        "eos_token_id": 2, "bos_token_id": 1, "max_position_embeddings": 256, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    off = trtllm_engine(model=str(model))
    assert isinstance(off, KvEventSource) and not off.kv_event_log.enabled
    engine = trtllm_engine(model=str(model), enable_kv_events=True, block_size=2)
    await engine.start()
    try:
        assert engine.kv_event_log.enabled
        req = GenerateRequest("r", (5, 6, 7, 8, 9), SamplingParams(max_tokens=2))
        async for _ in engine.generate(req):
            pass
        for _ in range(100):
            if engine.kv_event_log.next_id:
                break
            await asyncio.sleep(0.03)
        records, _ = engine.kv_event_log.since(-1)
        assert isinstance(records[0].event, AllBlocksCleared)  # TensorRT-LLM's "created"
        assert engine.kv_event_log.num_blocks == 4096
        stored = [r.event for r in records if isinstance(r.event, BlockStored)]
        assert stored, records
        assert stored[0].token_ids[:4] == (5, 6, 7, 8) and stored[0].block_size == 2
        assert stored[0].parent_block_hash is None
        # A second prompt sharing the first block: its stored run chains to that block.
        req = GenerateRequest("r2", (5, 6, 1, 2, 3), SamplingParams(max_tokens=2))
        async for _ in engine.generate(req):
            pass
        for _ in range(100):
            if len(engine.kv_event_log.since(-1)[0]) > len(records):
                break
            await asyncio.sleep(0.03)
        last = engine.kv_event_log.since(-1)[0][-1].event
        assert isinstance(last, BlockStored) and last.token_ids == (1, 2)
        assert last.parent_block_hash == stored[0].block_hashes[0]
    finally:
        await engine.stop()
