"""Multimodal prompts for TensorRT-LLM in the documented TextPrompt form (reference §2.2, §7).

TensorRT-LLM's input processor for a VLM takes the chat-templated text with one placeholder per
image plus the images, and expands the placeholders itself with the model's HF processor. Given
token ids plus images it would decode them back to text anyway, so the adapter sends the text:
the gateway's own prompt ids decoded (special tokens kept, so the BOS and the image token come
through verbatim) and `add_special_tokens=False` on the request's SamplingParams.
"""

from __future__ import annotations

from typing import Any, Protocol


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
