"""Which way a prompt's KV moves from a prefill sibling: the capability exchange at its /info.

    both on GPUs of this host     cuda_ipc   the prefill GPU's arena, one peer copy across
    one host                      shm        the prefill core's shared-memory arena, one copy
    elsewhere, NIXL on both ends  nixl       one READ of the staged region (kv_nixl.py)
    elsewhere                     http       protocol v2's kv_stream (pinned host staging)
    a sibling without v2          v1         a kv_wire blob (GET /internal/v1/kv/{id})

"One host" is proven, not assumed: this process opens the arena the sibling names and finds the
probe token the sibling announced at its start (another host, or a container with its own
/dev/shm, does not). cuda_ipc also needs both processes to see both GPUs under the same indexes
(docs/disaggregation.md); a region that cannot be opened fails over to http for that sibling.
"""

from __future__ import annotations

import logging

from trtllm_gateway.engine.disagg.kv_nixl import available
from trtllm_gateway.engine.disagg.sibling_wire import SiblingInfo
from trtllm_gateway.engine.kv_region import HostArenas
from trtllm_gateway.engine.protocol import EngineInfo

logger = logging.getLogger(__name__)

# How the core's refusals of a sibling's KV begin (engine/builtin/sequence_builder.py, the transfer
# worker): the decode side prefills such a prompt locally.
KV_REFUSED = "remote prefill KV refused"
KV_COPY_FAILED = "the copy failed"  # after KV_REFUSED: the source could not be read


def choose_transport(want: str, info: SiblingInfo, ours: EngineInfo, arenas: HostArenas) -> str:
    """want: --kv-transport (auto, cuda_ipc, shm, http, nixl); the transport for this sibling."""
    if 2 not in info.protocol_versions:
        return "v1"
    token = info.kv_arena_token.encode()
    same_host = bool(token) and arenas.token(info.kv_arena) == token
    nixl = info.kv_nixl and available()
    if want == "auto":
        if same_host:
            return "cuda_ipc" if info.kv_cuda and ours.kv_cuda else "shm"
        return "nixl" if nixl else "http"
    if want == "nixl" and not nixl:
        where = "here" if not available() else "on the sibling"
        logger.warning("--kv-transport nixl: NIXL is not installed %s; using http", where)
        return "http"
    if want == "cuda_ipc" and not (info.kv_cuda and ours.kv_cuda):
        logger.warning("--kv-transport cuda_ipc: an instance is not on a GPU; using http")
        return "http"
    if want in ("shm", "cuda_ipc") and not same_host:
        logger.warning("--kv-transport %s: the sibling's arena is not visible here; http", want)
        return "http"
    return want
