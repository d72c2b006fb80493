"""A tiny random LLaVA checkpoint built from transformers configs (tests only).

Vision tower (CLIP, 32x32 images in 8x8 patches), projector and a 2-layer Llama with hidden 64,
a byte-level BPE tokenizer that has the <image> token and a llava-1.5 style chat template, and
the checkpoint's image processor: saved the way llava-hf checkpoints are, in a few hundred KB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

IMAGE_TOKEN = "<image>"
# llava-hf's llava-1.5 template: images of a message first, then its text parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' ' }}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
_CORPUS = ["USER: describe the picture please. ASSISTANT: a red cat sits on a blue mat 0123"]


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<s>", "</s>", IMAGE_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_tiny_llava(
    path: Path, kind: Literal["llava", "llava_next"] = "llava", seed: int = 0
) -> Path:
    """Save a random tiny LLaVA (or llava-v1.6 "anyres") checkpoint under path; returns path."""
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig

    tokenizer = build_tokenizer()
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=0.2,  # decisive logits: greedy comparisons without near-ties
    )
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=32,
        initializer_range=0.2,
    )
    common: dict[str, Any] = {
        "vision_config": vision,
        "text_config": text,
        "image_token_id": tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "tie_word_embeddings": False,
    }
    torch.manual_seed(seed)
    if kind == "llava":
        from transformers import LlavaConfig, LlavaForConditionalGeneration
        from transformers.models.clip import CLIPImageProcessorPil

        model: Any = LlavaForConditionalGeneration(LlavaConfig(**common))
        processor: Any = CLIPImageProcessorPil(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        )
    else:
        from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration
        from transformers.models.llava_next import LlavaNextImageProcessorPil

        pinpoints = [[32, 32], [32, 64], [64, 32], [64, 64]]
        model = LlavaNextForConditionalGeneration(
            LlavaNextConfig(**common, image_grid_pinpoints=pinpoints)
        )
        with torch.no_grad():
            model.model.image_newline.normal_(0, 0.5)
        processor = LlavaNextImageProcessorPil(
            size={"shortest_edge": 32},
            crop_size={"height": 32, "width": 32},
            image_grid_pinpoints=pinpoints,
        )
    model.eval().save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    processor.save_pretrained(str(path))
    return path


def load_hf(path: Path) -> Any:
    """The transformers reference model of a tiny checkpoint, in float32 on CPU."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(path), dtype="float32").eval()


def sample_images() -> list[Any]:
    """Three small RGB images that differ in content and aspect ratio."""
    from PIL import Image

    return [
        Image.new("RGB", (40, 40), (200, 30, 30)),
        Image.radial_gradient("L").convert("RGB").resize((48, 32)),
        Image.linear_gradient("L").convert("RGB").resize((24, 56)),
    ]
