"""Copy a tokenizer directory with its BPE vocabulary padded to a model shape's vocab_size.

Why: the GPU suite serves dummy-weight shapes with a small tokenizer (SmolLM2's, 49,152 ids).
A random Llama-3.1-8B shape samples ids up to 128,255; the ones past the tokenizer's vocabulary
decode to nothing, so the gateway skips their chunks and streams about 40% of the tokens as
chunks, much less work than a real 8B deployment. The padding ids are made of two existing
tokens' text, so every sampled id decodes to ordinary byte-level text (one chunk a token).

  python -m bench.vocab_pad SRC_DIR DST_DIR 128256
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
from pathlib import Path


def pad(src: Path, dst: Path, vocab_size: int) -> int:
    """Write dst (a copy of src) with model.vocab grown to vocab_size ids; the ids added."""
    shutil.copytree(src, dst, dirs_exist_ok=True)
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    specials = {t["content"] for t in tok.get("added_tokens", [])}
    used = set(vocab.values()) | {t["id"] for t in tok.get("added_tokens", [])}
    pieces = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    pieces = pieces[256:]  # past the single bytes: multi-byte, mostly whole words
    pairs = itertools.product(pieces, pieces)
    added = 0
    for new_id in range(vocab_size):
        if new_id in used:
            continue
        text = "".join(next(pairs))
        while text in vocab:
            text = "".join(next(pairs))
        vocab[text] = new_id
        added += 1
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    return added


def main() -> None:
    src, dst, size = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    print(f"{dst}: {pad(src, dst, size)} ids added, vocabulary {size}")


if __name__ == "__main__":
    main()
