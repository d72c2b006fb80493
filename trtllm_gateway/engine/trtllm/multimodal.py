"""Multimodal prompts for TensorRT-LLM in the documented TextPrompt form (reference §2.2, §7).

With an encode sibling (--encode-url, engine.trtllm.encode) the images are replaced by their
embeddings (`multi_modal_embeddings`), and a failed sibling means the images go as they are.

TensorRT-LLM's input processor for a VLM takes the chat-templated text with one placeholder per
image plus the images, and expands the placeholders itself with the model's HF processor. Given
token ids plus images it would decode them back to text anyway, so the adapter sends the text:
the gateway's own prompt ids decoded (special tokens kept, so the BOS and the image token come
through verbatim) and `add_special_tokens=False` on the request's SamplingParams.

Precomputed embeddings reach the model's input processor's `attach_multimodal_embeddings`; in
1.2 only LlavaNext's takes tensors (tensorrt_llm/inputs/registry.py: the base one raises
NotImplementedError; Llama4's wants dicts with its special tokens). For any other model
image_embeds are a 400 here, and --encode-url is refused at start (engine.trtllm.loader).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from trtllm_gateway.engine.disagg.embed_tensors import check_layout, finite_tensor
from trtllm_gateway.engine.disagg.embed_wire import Frame
from trtllm_gateway.engine.protocol import GenerateRequest, ImageInput, InvalidRequestError

EMBEDDING_MODEL_TYPES = frozenset({"llava_next"})
"""Model types whose 1.2 input processor takes `multi_modal_embeddings` as tensors."""


def takes_embeddings(layout: str) -> bool:
    """Whether a model of this embed layout (`trtllm:<model_type>:hidden=N`) takes them."""
    parts = layout.split(":")
    return len(parts) > 1 and parts[1] in EMBEDDING_MODEL_TYPES


class _Embedder(Protocol):
    """engine.trtllm.encode.RemoteEmbeddings (an encode sibling), as this module uses it."""

    async def embed(
        self, images: Sequence[ImageInput], trace: tuple[tuple[str, str], ...] = ()
    ) -> list[Any] | None: ...


class _Decoder(Protocol):
    def decode(self, token_ids: Any, skip_special_tokens: bool = True) -> str: ...


def text_prompt(
    prompt_token_ids: tuple[int, ...], images: list[object], tokenizer: _Decoder
) -> dict[str, Any]:
    """{"prompt": text with the image placeholders, "multi_modal_data": {"image": [PIL, ...]}}."""
    return {
        "prompt": tokenizer.decode(list(prompt_token_ids), skip_special_tokens=False),
        "multi_modal_data": {"image": images},
    }


async def image_inputs(
    req: GenerateRequest, tokenizer: _Decoder, remote: _Embedder | None, layout: str
) -> dict[str, Any]:
    """The TextPrompt for a request with images: precomputed embeddings the client sent
    (image_embeds parts, of this model's `layout`), else their embeddings from an encode
    sibling when there is one and it answers, else the images themselves."""
    inputs = text_prompt(req.prompt_token_ids, [i.payload for i in req.images], tokenizer)
    given = [i.payload for i in req.images if isinstance(i.payload, Frame)]
    if given:
        if not takes_embeddings(layout):
            raise InvalidRequestError(
                f"this model ({layout.split(':')[1]}) takes no image_embeds on TensorRT-LLM 1.2 "
                f"(only {', '.join(sorted(EMBEDDING_MODEL_TYPES))}); send the images instead",
                param="messages",
            )
        if len(given) != len(req.images):
            # 1.2's generate_async takes multi_modal_data or multi_modal_embeddings, not both.
            raise InvalidRequestError(
                "TensorRT-LLM takes images or image_embeds in one request, not both",
                param="messages",
            )
        for frame in given:
            check_layout(frame, layout)
        return _embedded(inputs, [finite_tensor(f) for f in given])
    if remote is None or not takes_embeddings(layout):
        return inputs
    tensors = await remote.embed(req.images, req.trace_headers)
    if tensors is None:  # counted as local_fallback by the RemoteEncoder
        return inputs
    return _embedded(inputs, tensors)


def _embedded(inputs: dict[str, Any], tensors: list[Any]) -> dict[str, Any]:
    prompt = {k: v for k, v in inputs.items() if k != "multi_modal_data"}
    return {**prompt, "multi_modal_embeddings": {"image": tensors}}
