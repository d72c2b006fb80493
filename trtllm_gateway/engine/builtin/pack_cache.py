"""PackCache: a model's packed GGUF blocks (packed_linear.py) kept on disk between starts.

Packing checks every weight of every projection bit for bit: 1.8 of the 2.2 s a CPU load of the
default model took on a 2-core VM, paid again by every start (each API server's core, each test's
engine). The first start of a model directory writes what it packed, and which layers stayed
dense, to one safetensors file under the cache root (`packed/`); later starts read it instead.

The key is the model directory's path and its weight files' names, sizes and modification times
(as model_source.py keys a converted GGUF), with PACK_FORMAT: a changed checkpoint or packing
format is a new file. A file that cannot be read, or whose shapes do not fit the model's layers,
is ignored and packed afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PACK_FORMAT = 1  # bump when pack_q4_1 / pack_q8_0 change what they return

# A layer's qualified name -> (kind, its two packed tensors), or None where it stayed dense.
Packs = dict[str, tuple[str, tuple[torch.Tensor, torch.Tensor]] | None]


class PackCache:
    def __init__(self, model_dir: Path, root: Path) -> None:
        files = sorted(model_dir.glob("*.safetensors"))
        stamp = [f"{PACK_FORMAT}", str(model_dir.resolve())]
        for f in files:
            st = f.stat()
            stamp.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
        key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
        self.path = root / "packed" / f"{model_dir.name}-{key}.safetensors"
        self.usable = bool(files)

    def load(self) -> Packs | None:
        """What an earlier start packed, or None (no file, or one that cannot be read)."""
        if not self.usable or not self.path.is_file():
            return None
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as f:
                meta = json.loads((f.metadata() or {})["layers"])
                packs: Packs = {}
                for name, kind in meta.items():
                    if kind is None:
                        packs[name] = None
                    else:
                        a, b = f.get_tensor(f"{name}/0"), f.get_tensor(f"{name}/1")
                        packs[name] = (kind, (a, b))
        except Exception as exc:  # a truncated or foreign file: pack again and rewrite it
            logger.warning("packed weights at %s unreadable (%s); packing again", self.path, exc)
            return None
        return packs

    def save(self, packs: Packs) -> None:
        """Write atomically (a temporary file renamed), so a concurrent start reads all or none."""
        if not self.usable:
            return
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        layers: dict[str, str | None] = {}
        for name, pack in packs.items():
            layers[name] = None if pack is None else pack[0]
            if pack is not None:
                tensors[f"{name}/0"], tensors[f"{name}/1"] = pack[1]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".pack-")
            os.close(fd)
            try:
                save_file(tensors, tmp, metadata={"layers": json.dumps(layers)})
                os.replace(tmp, self.path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        except OSError as exc:  # a read-only cache: every start packs, as before
            logger.warning("packed weights not cached at %s: %s", self.path, exc)
