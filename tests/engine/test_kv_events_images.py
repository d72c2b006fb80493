"""Image prompts on the ZMQ KV events: each block names the images its hash covers, so readers
(vLLM's structs, Dynamo's reader, tests/upstream/) tell apart two prompts that differ only by
image, and vLLM's extra_keys reproduce the engine's own block hashes."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tests.engine.conftest import EngineFactory, collect, greedy
from tests.engine.kv_capture import CacheView, Capture, check_against_engine, engine_cache
from tests.engine.test_llava import chat_ids, engine_overrides
from tests.engine.tiny_llava import build_tiny_llava, sample_images
from tests.upstream import dynamo_zmq_wire, vllm_kv_events_map
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput
from trtllm_gateway.multimodal.images import hash_image_bytes

BS = 4  # engine_overrides' block size


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("llava"), "llava")


async def test_two_prompts_differing_by_image_never_share_a_block(
    llava_dir: Path, make_engine: EngineFactory
) -> None:
    engine = await make_engine(**engine_overrides(llava_dir))
    ids = tuple(chat_ids(llava_dir, 1))
    red, gradient, _ = sample_images()
    # Hashes as the gateway names images: BLAKE3 of the bytes, hex (multimodal/images.py).
    a = ImageInput(hash_image_bytes(red.tobytes()), red)
    b = ImageInput(hash_image_bytes(gradient.tobytes()), gradient)
    vllm_frames, dynamo_frames = [], []
    async with Capture(engine, ("vllm", "dynamo")) as cap:
        for request_id, image in (("a", a), ("b", b)):
            events = await collect(engine, GenerateRequest(request_id, ids, greedy(3), (image,)))
            usage = events[-1].usage
            assert usage is not None
            prompt_len = usage.prompt_tokens  # the expanded prompt
            vllm_frames.append(await cap.frames("vllm"))
            dynamo_frames.append(await cap.frames("dynamo"))

    # vLLM: every stored block's extra_keys name the request's image at its offset from the
    # block; the identifiers are the keys the engine mixed into the hash (recomputed here).
    decoder = msgspec.msgpack.Decoder(type=vllm_kv_events_map.KVEventBatch)
    view = CacheView(BS)
    tokens: list[list[int]] = [[], []]
    hashes: list[set[int]] = [set(), set()]
    for i, (frames, image) in enumerate(zip(vllm_frames, (a, b), strict=True)):
        for _, _, payload in frames:
            for ev in decoder.decode(payload).events:
                if isinstance(ev, vllm_kv_events_map.AllBlocksCleared):
                    continue  # the engine's start-up event may reach the new subscriber
                assert isinstance(ev, vllm_kv_events_map.BlockStored)  # nothing evicted
                assert ev.extra_keys is not None and len(ev.extra_keys) == len(ev.block_hashes)
                for keys in ev.extra_keys:
                    assert keys is not None and [k[0] for k in keys] == [image.hash]
                extra = [b"".join(str(k[0]).encode() for k in keys or ()) for keys in ev.extra_keys]
                view.stored(ev.block_hashes, ev.parent_block_hash, ev.token_ids, extra)
                tokens[i] += ev.token_ids
                hashes[i] |= set(ev.block_hashes)
    assert check_against_engine(view, engine, "vllm") == len(hashes[0]) + len(hashes[1])
    full = prompt_len // BS * BS
    assert tokens[0][:full] == tokens[1][:full] and full >= 4 * BS  # same prompt tokens ...
    assert not hashes[0] & hashes[1]  # ... and not one block in common

    # Dynamo: block_mm_infos name the image by the first 16 hex digits of its hash, per block.
    held: set[int] = set()
    mm = [set(), set()]
    for i, frames in enumerate(dynamo_frames):
        for _, _, payload in frames:
            (ev,) = dynamo_zmq_wire.decode_batch(payload).events
            if ev.type == "AllBlocksCleared":
                continue
            assert ev.type == "BlockStored" and ev.block_mm_infos is not None
            assert len(ev.block_mm_infos) == len(ev.block_hashes)
            for info in ev.block_mm_infos:
                assert info is not None
                mm[i] |= {(o.mm_hash, tuple(o.offsets)) for o in info}
            held |= {h - (1 << 64) if h >= 1 << 63 else h for h in ev.block_hashes}
    assert mm == [{(int(a.hash[:16], 16), ())}, {(int(b.hash[:16], 16), ())}]
    assert held == set(engine_cache(engine, "dynamo"))
