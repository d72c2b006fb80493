"""Dynamo's reader of raw ZMQ KV event payloads, rule for rule, in Python.

Transcribed from ai-dynamo/dynamo lib/kv-router/src/zmq_wire.rs @
55d70854a9dd4c65c5c80b9509fdbdc31f43234f: KvEventBatch (deserialized as the tuple `(f64,
Vec<RawKvEvent>, Option<i32>)`), RawKvEventVisitor::visit_map / visit_seq (the fields it reads,
their Rust types, the ones it requires, unknown keys and trailing elements skipped),
BlockHashValue (`i64` or `u64`, untagged), KvTokenIds (Vec<u32> or Vec<(u32, u32)>, untagged),
BlockExtraInfo / BlockMmObjectInfo (lib/kv-router/src/protocols.rs: `{mm_objects: [{mm_hash: u64,
offsets: Vec<(usize, usize)>}]}`) and extra_keys_to_block_mm_infos. The payload is read with
`msgpack` (rmp_serde's role), never with the gateway's decoder; a value of the wrong type raises
DecodeError where serde would fail the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

U64 = 1 << 64


class DecodeError(ValueError):
    pass


@dataclass
class MmObject:
    mm_hash: int
    offsets: list[tuple[int, int]]


@dataclass
class RawKvEvent:
    type: str  # BlockStored | BlockRemoved | AllBlocksCleared
    block_hashes: list[int]  # normalized to u64 (BlockHashValue::into_u64)
    parent_block_hash: int | None = None
    token_ids: list[int] | None = None
    block_size: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    block_mm_infos: list[list[MmObject] | None] | None = None


@dataclass
class KvEventBatch:
    ts: float
    events: list[RawKvEvent]
    data_parallel_rank: int | None


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < hi:
        raise DecodeError(f"{what}: expected an integer in [{lo}, {hi}), got {v!r}")
    return v


def _hash(v: Any) -> int:
    return _int(v, -(1 << 63), U64, "block hash") % U64  # Signed(i64) | Unsigned(u64)


def _opt_str(v: Any, what: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise DecodeError(f"{what}: expected a string or nil, got {v!r}")
    return v


def _list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise DecodeError(f"{what}: expected an array, got {v!r}")
    return v


def _token_ids(v: Any) -> list[int]:
    items = _list(v, "token_ids")
    if all(isinstance(t, int) for t in items):  # KvTokenIds::Single(Vec<u32>)
        return [_int(t, 0, 1 << 32, "token id") for t in items]
    pairs = [tuple(_list(t, "token pair")) for t in items]  # Bigram(Vec<(u32, u32)>)
    out = [_int(p[0], 0, 1 << 32, "token id") for p in pairs]
    return [*out, _int(pairs[-1][1], 0, 1 << 32, "token id")] if pairs else out


def _mm_infos(v: Any) -> list[list[MmObject] | None] | None:
    if v is None:
        return None
    out: list[list[MmObject] | None] = []
    for info in _list(v, "block_mm_infos"):
        if info is None:
            out.append(None)
            continue
        if not isinstance(info, dict) or "mm_objects" not in info:
            raise DecodeError(f"BlockExtraInfo: missing field mm_objects in {info!r}")
        objects = []
        for obj in _list(info["mm_objects"], "mm_objects"):
            if not isinstance(obj, dict) or "mm_hash" not in obj or "offsets" not in obj:
                raise DecodeError(f"BlockMmObjectInfo: missing field in {obj!r}")
            offsets = [tuple(_list(o, "offset")) for o in _list(obj["offsets"], "offsets")]
            for o in offsets:
                if len(o) != 2:
                    raise DecodeError(f"offset: expected (usize, usize), got {o!r}")
            objects.append(
                MmObject(
                    _int(obj["mm_hash"], 0, U64, "mm_hash"),
                    [(_int(a, 0, U64, "offset"), _int(b, 0, U64, "offset")) for a, b in offsets],
                )
            )
        out.append(objects)
    return out


def _extra_keys_to_mm_infos(v: Any) -> list[list[MmObject] | None] | None:
    """extra_keys: Option<Vec<Option<Vec<String>>>>; 64-hex identifiers become mm hashes."""
    if v is None:
        return None
    infos: list[list[MmObject] | None] = []
    for keys in _list(v, "extra_keys"):
        objs = []
        for k in _list(keys, "extra_keys entry") if keys is not None else []:
            if not isinstance(k, str):
                raise DecodeError(f"extra_keys: expected a string, got {k!r}")
            if len(k) == 64 and all(c in "0123456789abcdefABCDEF" for c in k):
                objs.append(MmObject(int(k[:16], 16), []))
        infos.append(objs or None)
    return infos if infos and any(i is not None for i in infos) else None


def _event_from_map(m: dict[str, Any]) -> RawKvEvent:
    kind = m.get("type")
    if kind is None:
        raise DecodeError("missing field `type`")
    if kind == "AllBlocksCleared":
        return RawKvEvent("AllBlocksCleared", [])
    if kind not in ("BlockStored", "BlockRemoved"):
        raise DecodeError(f"unknown variant {kind!r}")
    if "block_hashes" not in m:
        raise DecodeError("missing field `block_hashes`")
    hashes = [_hash(h) for h in _list(m["block_hashes"], "block_hashes")]
    medium = _opt_str(m.get("medium"), "medium")
    if kind == "BlockRemoved":
        return RawKvEvent("BlockRemoved", hashes, medium=medium)
    for required in ("token_ids", "block_size"):
        if required not in m:
            raise DecodeError(f"missing field `{required}`")
    parent = m.get("parent_block_hash")
    mm = _mm_infos(m.get("block_mm_infos"))
    return RawKvEvent(
        "BlockStored",
        hashes,
        None if parent is None else _hash(parent),
        _token_ids(m["token_ids"]),
        _int(m["block_size"], 0, U64, "block_size"),
        medium,
        _opt_str(m.get("lora_name"), "lora_name"),
        mm if mm is not None else _extra_keys_to_mm_infos(m.get("extra_keys")),
    )


def _event_from_seq(s: list[Any]) -> RawKvEvent:
    if not s:
        raise DecodeError("sequence must start with event tag")
    tag = s[0]
    if tag == "AllBlocksCleared":
        return RawKvEvent("AllBlocksCleared", [])
    if tag == "BlockRemoved":
        if len(s) < 2:
            raise DecodeError("missing block_hashes")
        medium = _opt_str(s[2] if len(s) > 2 else None, "medium")
        return RawKvEvent("BlockRemoved", [_hash(h) for h in _list(s[1], "hashes")], medium=medium)
    if tag != "BlockStored":
        raise DecodeError(f"unknown variant {tag!r}")
    if len(s) < 5:
        raise DecodeError("missing block_hashes, token_ids or block_size")
    at = [*s, None, None, None, None, None][:10]  # lora_id, medium, lora_name, extra_keys, mm
    if at[5] is not None:
        _int(at[5], 0, U64, "lora_id")
    mm = _mm_infos(at[9])
    return RawKvEvent(
        "BlockStored",
        [_hash(h) for h in _list(s[1], "block_hashes")],
        None if s[2] is None else _hash(s[2]),
        _token_ids(s[3]),
        _int(s[4], 0, U64, "block_size"),
        _opt_str(at[6], "medium"),
        _opt_str(at[7], "lora_name"),
        mm if mm is not None else _extra_keys_to_mm_infos(at[8]),
    )


def decode_batch(payload: bytes) -> KvEventBatch:
    raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(raw, list) or len(raw) != 3:
        raise DecodeError(f"expected a tuple of size 3, got {type(raw).__name__}")
    ts, events, rank = raw
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise DecodeError(f"ts: expected f64, got {ts!r}")
    out = []
    for ev in _list(events, "events"):
        if isinstance(ev, dict):
            out.append(_event_from_map(ev))
        elif isinstance(ev, list):
            out.append(_event_from_seq(ev))
        else:
            raise DecodeError(f"expected a kv event encoded as a tagged map or sequence: {ev!r}")
    dp = None if rank is None else _int(rank, -(1 << 31), 1 << 31, "data_parallel_rank")
    return KvEventBatch(float(ts), out, dp)
