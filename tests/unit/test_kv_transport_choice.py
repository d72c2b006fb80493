"""kv_transport.choose_transport: which way a sibling's KV moves, NIXL included. The probe token
decides "one host"; NIXL needs the extra on both ends (the sibling's /info says kv_nixl)."""

from __future__ import annotations

import pytest

from trtllm_gateway.engine.disagg import kv_transport
from trtllm_gateway.engine.disagg.kv_transport import choose_transport
from trtllm_gateway.engine.disagg.sibling_wire import SiblingInfo
from trtllm_gateway.engine.kv_region import HostArenas
from trtllm_gateway.engine.protocol import EngineInfo

OURS = EngineInfo(model_id="m", max_model_len=64, vocab_size=10, eos_token_ids=(0,))


class Probe(HostArenas):
    def __init__(self, token: bytes) -> None:
        super().__init__()
        self._token = token

    def token(self, name: str) -> bytes:
        return self._token


def info(nixl: bool, cuda: bool = False) -> SiblingInfo:
    return SiblingInfo(
        protocol_version=1, model="m", kv_layout="l", protocol_versions=[1, 2],
        kv_arena="tgkv_1", kv_arena_token="tok", kv_cuda=cuda, kv_nixl=nixl,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("want", "sibling_nixl", "here_nixl", "same_host", "got"),
    [
        ("auto", True, True, False, "nixl"),  # another host, NIXL on both ends
        ("auto", False, True, False, "http"),  # the sibling has no NIXL
        ("auto", True, False, False, "http"),  # we have none
        ("auto", True, True, True, "shm"),  # one host: shared memory first
        ("nixl", True, True, True, "nixl"),  # asked for, on one host too
        ("nixl", False, True, False, "http"),
        ("nixl", True, False, False, "http"),
        ("http", True, True, False, "http"),
    ],
)
def test_nixl_is_chosen_only_where_both_ends_have_it(
    monkeypatch: pytest.MonkeyPatch,
    want: str,
    sibling_nixl: bool,
    here_nixl: bool,
    same_host: bool,
    got: str,
) -> None:
    monkeypatch.setattr(kv_transport, "available", lambda: here_nixl)
    probe = Probe(b"tok" if same_host else b"")
    assert choose_transport(want, info(sibling_nixl), OURS, probe) == got
