"""GET /v1/models and /v1/models/{model_id}: the one served model."""

from __future__ import annotations

from fastapi import APIRouter

from trtllm_gateway.app.deps import StateDep
from trtllm_gateway.app.errors import ModelNotFoundError
from trtllm_gateway.app.state import State
from trtllm_gateway.routers.schemas import ModelCard, ModelList

router = APIRouter(tags=["models"])


def _card(state: State) -> ModelCard:
    info = getattr(state.engine, "info", None)
    return ModelCard(
        id=state.model_name,
        root=state.settings.model,
        max_model_len=info.max_model_len if info is not None else None,
    )


@router.get("/v1/models")
async def list_models(state: StateDep) -> ModelList:
    return ModelList(data=[_card(state)])


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: StateDep) -> ModelCard:
    if model_id != state.model_name:
        raise ModelNotFoundError(f"The model `{model_id}` does not exist.", param="model")
    return _card(state)
