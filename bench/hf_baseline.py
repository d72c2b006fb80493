"""Baseline: HF transformers `generate` on the same random fixed-length workload (bf16, CUDA).

Random weights of the same shape, one static batch of random prompts, greedy, exactly
--output-len new tokens (min_new_tokens). transformers has no continuous batching, so the full
workload would run as successive batches at this rate; the batch is the largest of
--batch-sizes that fits in memory. Prints one JSON object last.

  python -m bench.hf_baseline --model trtllm_gateway/config/models/llama-3.1-8b.json \\
      --batch-sizes 128 64
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch


def build(shape: Path) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**json.loads(shape.read_text()))
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    return model.eval()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="trtllm_gateway/config/models/llama-3.1-8b.json")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 64, 32])
    args = p.parse_args()
    import transformers

    model = build(Path(args.model))
    vocab = model.config.vocab_size
    report: dict[str, Any] = {"transformers": transformers.__version__, "attempts": []}
    for bs in args.batch_sizes:
        ids = torch.randint(100, min(vocab, 32000), (bs, args.input_len), device="cuda")
        try:
            with torch.inference_mode():
                model.generate(ids[:, :16], max_new_tokens=4, do_sample=False)  # warm-up
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=args.output_len,
                    min_new_tokens=args.output_len,
                    do_sample=False,
                    pad_token_id=0,
                )
                torch.cuda.synchronize()
                wall = time.perf_counter() - t0
        except torch.OutOfMemoryError:
            report["attempts"].append({"batch": bs, "oom": True})
            torch.cuda.empty_cache()
            continue
        new = (out.shape[1] - args.input_len) * bs
        report.update(
            {
                "batch": bs,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "duration_s": wall,
                "output_tokens": new,
                "output_tok_s": new / wall,
            }
        )
        break
    print(json.dumps(report))


if __name__ == "__main__":
    main()
