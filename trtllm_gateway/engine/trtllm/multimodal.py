"""Multimodal prompts for TensorRT-LLM in the documented TextPrompt form (reference §2.2, §7).

With an encode sibling (--encode-url, engine.trtllm.encode) the images are replaced by their
embeddings (`multi_modal_embeddings`), and a failed sibling means the images go as they are.

TensorRT-LLM's input processor for a VLM takes the chat-templated text with one placeholder per
image plus the images, and expands the placeholders itself with the model's HF processor. Given
token ids plus images it would decode them back to text anyway, so the adapter sends the text:
the gateway's own prompt ids decoded (special tokens kept, so the BOS and the image token come
through verbatim) and `add_special_tokens=False` on the request's SamplingParams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from trtllm_gateway.engine.disagg.embed_tensors import check_layout, finite_tensor
from trtllm_gateway.engine.disagg.embed_wire import Frame
from trtllm_gateway.engine.protocol import GenerateRequest, InvalidRequestError

if TYPE_CHECKING:
    from trtllm_gateway.engine.trtllm.encode import RemoteEmbeddings


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
    req: GenerateRequest, tokenizer: _Decoder, remote: RemoteEmbeddings | None, layout: str
) -> dict[str, Any]:
    """The TextPrompt for a request with images: precomputed embeddings the client sent
    (image_embeds parts, of this model's `layout`), else their embeddings from an encode
    sibling when there is one and it answers, else the images themselves."""
    inputs = text_prompt(req.prompt_token_ids, [i.payload for i in req.images], tokenizer)
    given = [i.payload for i in req.images if isinstance(i.payload, Frame)]
    if given:
        if len(given) != len(req.images):
            # 1.2's generate_async takes multi_modal_data or multi_modal_embeddings, not both.
            raise InvalidRequestError(
                "TensorRT-LLM takes images or image_embeds in one request, not both",
                param="messages",
            )
        for frame in given:
            check_layout(frame, layout)
        return _embedded(inputs, [finite_tensor(f) for f in given])
    if remote is None:
        return inputs
    tensors = await remote.embed(req.images, req.trace_headers)
    if tensors is None:  # counted as local_fallback by the RemoteEncoder
        return inputs
    return _embedded(inputs, tensors)


def _embedded(inputs: dict[str, Any], tensors: list[Any]) -> dict[str, Any]:
    prompt = {k: v for k, v in inputs.items() if k != "multi_modal_data"}
    return {**prompt, "multi_modal_embeddings": {"image": tensors}}
