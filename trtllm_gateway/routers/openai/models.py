"""GET /v1/models and /v1/models/{model_id}: the served model and its LoRA adapters."""

from __future__ import annotations

from fastapi import APIRouter

from trtllm_gateway.routers.openai.schemas import ModelCard, ModelList
from trtllm_gateway.web.deps import StateDep
from trtllm_gateway.web.errors import ModelNotFoundError
from trtllm_gateway.web.state import State

router = APIRouter(tags=["models"])


def _card(state: State) -> ModelCard:
    info = getattr(state.engine, "info", None)
    return ModelCard(
        id=state.model_name,
        root=state.tokenizer_path or state.config.engine.model,
        max_model_len=info.max_model_len if info is not None else None,
    )


def _cards(state: State) -> list[ModelCard]:
    """The base model, then one card per LoRA adapter (its parent is the base, as vLLM's)."""
    base = _card(state)
    info = getattr(state.engine, "info", None)
    names = info.lora_names if info is not None else ()
    return [base] + [
        ModelCard(id=name, root=name, parent=base.id, max_model_len=base.max_model_len)
        for name in names
    ]


@router.get("/v1/models")
async def list_models(state: StateDep) -> ModelList:
    return ModelList(data=_cards(state))


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: StateDep) -> ModelCard:
    for card in _cards(state):
        if card.id == model_id:
            return card
    raise ModelNotFoundError(f"The model `{model_id}` does not exist.", param="model")
