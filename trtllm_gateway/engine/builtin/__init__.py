"""The built-in PyTorch engine: EngineCore and its step.

Importing it loads torch under the engine's OpenMP waiting policy (openmp_env.py).
"""

from trtllm_gateway.engine.builtin.openmp_env import load_torch

load_torch()
