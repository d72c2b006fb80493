"""Stand-in `tensorrt_llm.inputs.registry`: which input processor takes precomputed embeddings.

Upstream (tensorrt_llm/inputs/registry.py, 1.2 window): the base input processor's
`attach_multimodal_embeddings` is

    raise NotImplementedError("Input processor does not support multimodal embedding input")

and in 1.2 only two models override it (tensorrt_llm/_torch/models/): `LlavaNextInputProcessor`
(model_type "llava_next"; a list of [tokens, hidden] tensors, "image" only, the text hidden
size) and `Llama4InputProcessor` (model_type "llama4"), which wants each image as a dict with
`mm_embeddings`, `image_special_tokens` and `image_special_token_offsets` and raises
ValueError("Llama4 image embedding must contain special token information") for a bare tensor.
Every other model raises NotImplementedError, which `LLM.generate_async` lets through: not a
ValueError, not a RequestError. Later versions add more models (Qwen2-VL among them).
"""

from __future__ import annotations

from typing import Any

from tensorrt_llm import _scripted


class InputProcessor:
    """The base processor: no precomputed embeddings."""

    def __init__(self, vocab: int, hidden: int) -> None:
        self.vocab = vocab
        self.hidden = hidden

    def attach_multimodal_embeddings(self, prompt: Any, embeddings: Any) -> list[int]:
        raise NotImplementedError("Input processor does not support multimodal embedding input")


class LlavaNextInputProcessor(InputProcessor):
    def attach_multimodal_embeddings(self, prompt: Any, embeddings: Any) -> list[int]:
        """A text prompt, image modality only, each tensor of the text model's hidden size;
        each embedding adds the token its image would (an image and its embedding agree)."""
        import torch

        if not isinstance(prompt, str) or not prompt:
            raise ValueError("Text prompt is required but not provided")
        if not isinstance(embeddings, dict):
            raise ValueError("multimodal_embedding must be a dictionary")
        if "image" not in embeddings:
            raise ValueError("Only image modality is supported for external multimodal embedding")
        tensors = embeddings["image"]
        tensors = tensors if isinstance(tensors, list) else [tensors]
        ids = [b % self.vocab for b in prompt.encode()]
        for tensor in tensors:
            if (
                not isinstance(tensor, torch.Tensor)
                or tensor.dim() != 2
                or tensor.shape[1] != self.hidden
            ):
                shape = list(getattr(tensor, "shape", []))
                raise ValueError(f"embedding of shape {shape} does not match hidden {self.hidden}")
            ids.append(_scripted.embedding_token(tensor, self.vocab))
        return ids


class Llama4InputProcessor(InputProcessor):
    def attach_multimodal_embeddings(self, prompt: Any, embeddings: Any) -> list[int]:
        items = embeddings.get("image") if isinstance(embeddings, dict) else None
        if not items or not isinstance(items[0], dict):
            raise ValueError("Llama4 image embedding must contain special token information")
        raise NotImplementedError("stand-in: Llama4's special-token embedding dicts")


_PROCESSORS: dict[str, type[InputProcessor]] = {
    "llava_next": LlavaNextInputProcessor,
    "llama4": Llama4InputProcessor,
}


def create_input_processor(model_type: str | None, vocab: int, hidden: int) -> InputProcessor:
    """The registered processor of this model type (registry.py `create_input_processor`)."""
    return _PROCESSORS.get(model_type or "", InputProcessor)(vocab, hidden)
