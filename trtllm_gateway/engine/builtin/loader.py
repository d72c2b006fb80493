"""Load the built-in engine's pieces from its EngineConfig: model, KV cache, blocks, backend."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from trtllm_gateway.config.engine import EngineConfig
from trtllm_gateway.engine.builtin import fp8
from trtllm_gateway.engine.builtin.attention import (
    AttentionMetadata,
    decode_kernel,
    paged_attention,
)
from trtllm_gateway.engine.builtin.backend import Backend
from trtllm_gateway.engine.builtin.block_manager import BlockManager
from trtllm_gateway.engine.builtin.cpu_backend import CpuBackend
from trtllm_gateway.engine.builtin.cpu_decode import attach_decode_stack
from trtllm_gateway.engine.builtin.cpu_kernels.build import block_gemm, is_built
from trtllm_gateway.engine.builtin.cpu_threads import sized
from trtllm_gateway.engine.builtin.device_dtype import pick_device, pick_dtype
from trtllm_gateway.engine.builtin.fp8_checkpoint import Fp8Checkpoint
from trtllm_gateway.engine.builtin.fp8_linear import quantize_fp8
from trtllm_gateway.engine.builtin.model import (
    MLP,
    Attention,
    LlamaModel,
    RMSNorm,
)
from trtllm_gateway.engine.builtin.model_config import ModelConfig
from trtllm_gateway.engine.builtin.pack_cache import PackCache, Packs
from trtllm_gateway.engine.builtin.packed_linear import pack_linears
from trtllm_gateway.engine.builtin.piecewise_graph import largest_bucket
from trtllm_gateway.engine.builtin.quant import quantize_int8
from trtllm_gateway.engine.builtin.vision.encoder import VisionEncoder, load_encoder
from trtllm_gateway.engine.builtin.vision.spec import is_vision_checkpoint, language_config
from trtllm_gateway.engine.builtin.weights import build_model
from trtllm_gateway.engine.model_source import cache_root, resolve_model

logger = logging.getLogger(__name__)

CPU_KV_BUDGET_BYTES = 1 << 30  # --kv-cache-fraction applies to this on CPU
# A decode-attention multiply-add streams its K/V operand from memory once, with no reuse in
# registers: on one AVX2 core it ran at 5.2 GFMA/s against the packed projections' ~18 at 8-32
# rows (docs/benchmarks.md, issue 28), so cpu_threads.py sizes it as about 4 projection ones.
ATTN_FMA_COST = 4


@dataclass(slots=True)
class LoadedModel:
    cfg: ModelConfig
    model: LlamaModel
    model_dir: Path | None
    device: torch.device
    dtype: torch.dtype
    blocks: BlockManager
    backend: Backend  # runs a StepBatch's forward on the device (CpuBackend, TritonBackend)
    max_model_len: int
    kv_layout: str
    vision: VisionEncoder | None = None  # LLaVA checkpoints: tower + projector


def load(config: EngineConfig, progress: Callable[[str], None] = lambda _: None) -> LoadedModel:
    """Build everything; `progress` hears what a slow start is doing (health's detail)."""
    progress("loading the model")
    device = pick_device(config.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # Triton kernels and graphs run on the current device
    dtype = pick_dtype(config.dtype, device, config.quantization)
    if config.packed_weights == "int8" and (
        device.type != "cpu" or dtype != torch.float32 or config.quantization == "int8"
    ):
        raise ValueError(
            "--packed-weights int8 is for the CPU path with float32 weights "
            "(--dtype auto or float32, no --quantization int8)"
        )
    if config.load_format == "dummy":
        model_dir = None
        cfg = ModelConfig.from_dict(json.loads(Path(config.model).read_text()))
        if config.tokenizer:
            model_dir = Path(config.tokenizer)
    else:
        model_dir = resolve_model(config.model, config.cache_dir)
        cfg = language_config(model_dir).with_generation_eos(model_dir)
    max_len = min(config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    wants_fp8 = config.quantization == "fp8" or config.fp8_kv
    if wants_fp8 and (reason := fp8.unsupported(device)) is not None:
        raise ValueError(reason)
    reader = Fp8Checkpoint()
    model = build_model(
        cfg,
        model_dir,
        dtype,
        device,
        max_len,
        dummy=config.load_format == "dummy",
        seed=config.seed,
        reader=reader,
    )
    _apply_fp8(model, cfg, reader, config, device)
    kernels: ModuleType | None = None
    if config.quantization == "int8":
        if device.type != "cpu":
            raise ValueError("--quantization int8 is for the CPU path; CUDA runs bf16")
        logger.info("int8 weight copies for %d linear layers", quantize_int8(model))
    elif config.packed_weights != "off" and device.type == "cpu" and dtype == torch.float32:
        cache = None
        if config.load_format != "dummy" and model_dir is not None:
            cache = PackCache(model_dir, cache_root(config.cache_dir))
        kernels = _pack(model, config.packed_weights == "int8", cache, progress)
    kv_dtype = fp8.FP8 if config.fp8_kv else dtype
    num_blocks = _num_blocks(config, cfg, kv_dtype, device)
    bs = config.block_size
    max_len = min(max_len, num_blocks * bs)
    slots = num_blocks * bs
    shape = (cfg.num_layers, 2, slots, cfg.num_kv_heads, cfg.head_dim)
    kv = torch.zeros(shape, dtype=kv_dtype, device=device)
    kv_caches = [(kv[i, 0], kv[i, 1]) for i in range(cfg.num_layers)]
    if kernels is not None and attach_decode_stack(model, kernels, kv_caches, bs, ATTN_FMA_COST):
        logger.info("CPU decode steps: the decoder stack in one kernel call (cpu_decode.py)")
    logger.info("KV cache: %d blocks of %d tokens (%.2f GiB)", num_blocks, bs, kv.nbytes / 2**30)
    blocks = BlockManager(num_blocks, bs, config.enable_prefix_caching)
    backend: Backend
    if device.type == "cuda":
        from trtllm_gateway.engine.builtin.triton_backend import TritonBackend  # imports Triton

        backend = TritonBackend(
            model,
            kv_caches,
            bs,
            device,
            max_len,
            config.max_batch_size,
            config.cuda_graphs,
            config.max_num_tokens,
        )
    else:
        backend = CpuBackend(model, kv_caches, bs, device)
    # What disaggregated siblings must share to move KV blocks: the cache's dtype included.
    layout = (
        f"{cfg.model_type}:{cfg.num_layers}x{cfg.num_kv_heads}x{cfg.head_dim}:{kv_dtype}:bs{bs}"
    )
    vision = None
    if model_dir is not None and is_vision_checkpoint(model_dir):
        vision = load_encoder(model_dir, dtype, device)
    return LoadedModel(
        cfg, model, model_dir, device, dtype, blocks, backend, max_len, layout, vision
    )


def _apply_fp8(
    model: LlamaModel,
    cfg: ModelConfig,
    reader: Fp8Checkpoint,
    config: EngineConfig,
    device: torch.device,
) -> None:
    """--quantization fp8 (the checkpoint's e4m3 weights where it has them) and the KV scales."""
    if config.quantization == "fp8":
        count = quantize_fp8(model, reader.given(cfg))
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the dense weights' memory: the KV cache is sized next
        source = "read from the checkpoint" if reader.is_fp8 else "quantized at load"
        logger.info("FP8 weights (%s) for %d linear layers", source, count)
    elif reader.is_fp8:
        logger.warning(
            "an FP8 checkpoint: its weights are dequantized to %s (--quantization fp8 runs them "
            "as FP8)",
            model.embed_tokens.weight.dtype,
        )
    if config.fp8_kv:
        for i, layer in enumerate(model.decoder_layers):
            got = reader.kv_scales.get(i, {})
            layer.self_attn.kv_scales = (got.get("k", 1.0), got.get("v", 1.0))
        scaled = "the checkpoint's scales" if reader.kv_scales else "scale 1.0"
        logger.info("FP8 KV cache (e4m3, %s)", scaled)


def _num_blocks(
    config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype, device: torch.device
) -> int:
    if config.num_kv_blocks:
        return config.num_kv_blocks
    block_bytes = cfg.kv_elems_per_token * config.block_size * dtype.itemsize
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        # Keep room for activations, decode-graph logits and sampling beside the cache.
        rows = min(config.max_batch_size, 512) + config.max_num_tokens // 8
        reserve = (1 << 30) + 3 * rows * cfg.vocab_size * 4
        per_token = (3 * cfg.intermediate_size + 8 * cfg.hidden_size) * 4
        reserve += config.max_num_tokens * per_token
        if config.cuda_graphs:  # the piecewise graphs' pool holds its own (piecewise_graph.py)
            reserve += largest_bucket(config.max_num_tokens, cfg) * per_token
        budget = int(min(free * config.kv_cache_fraction, free - reserve))
    else:
        budget = int(CPU_KV_BUDGET_BYTES * config.kv_cache_fraction)
    return max(2, budget // block_bytes)


def _pack(
    model: LlamaModel, int8: bool, cache: PackCache | None, progress: Callable[[str], None]
) -> ModuleType | None:
    """Pack the model's GGUF-block weights for the CPU kernels (reading an earlier start's packs
    from the cache when it has them); the kernels' module, or None."""
    if not is_built():
        progress("building CPU kernels (first start of this install; cached for later starts)")
    kernels = block_gemm()
    if kernels is not None:
        if int8 and not kernels.q8_native():
            # The portable build's int8 loop is the reference the tests compare, one value at a
            # time: slower than float32's vector loop, so asking for speed must not get it.
            logger.warning(
                "int8 activations need the avx2 or avx512 CPU kernels (this is the %s build); "
                "float32 activations instead",
                kernels.simd_path(),
            )
            int8 = False
        known = cache.load() if cache is not None else None
        counts, packs = pack_linears(model, kernels, int8, known)
        if cache is not None and not _all_reused(packs, known):
            cache.save(packs)
        acts = "int8 activations, every step" if int8 else "float32 activations, small steps"
        how = f"from {cache.path}" if known is not None and cache is not None else "packed now"
        logger.info("packed weights (%s, %s): %s", acts, how, dict(counts))
        # A decode row's attention: heads x context x head_dim, twice (scores, then values).
        decode = sized(decode_kernel(kernels), _attn_fmas)
        model.attn_fn = functools.partial(paged_attention, decode=decode)
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.kernel = kernels.rms_norm
            elif isinstance(m, Attention):
                m.rope_store = kernels.rope_store
            elif isinstance(m, MLP):
                m.silu_mul = kernels.silu_mul
    return kernels


def _all_reused(packs: Packs, known: Packs | None) -> bool:
    """Every layer's pack is the cached object itself (nothing packed now)."""
    if known is None or packs.keys() != known.keys():
        return False
    return all(pack is known[name] for name, pack in packs.items())


def _attn_fmas(
    q: torch.Tensor, _k: torch.Tensor, _v: torch.Tensor, meta: AttentionMetadata, _scale: float
) -> int:
    """A decode step's attention in the projections' multiply-adds: rows x heads x head_dim x the
    longest context, twice (scores, then values), times ATTN_FMA_COST."""
    return ATTN_FMA_COST * 2 * q.numel() * meta.decode_len
