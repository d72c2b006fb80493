"""trtllm-gateway: an OpenAI-compatible server over TensorRT-LLM or a built-in PyTorch engine.

One package, its folders keeping their roles: app (process wiring), openai (the OpenAI serving
layer), tool_parsers and reasoning (reply parsers), internal_api (the sibling-facing /internal/
endpoints), engine (the engine protocol and both engines), multimodal (image loading), config
(settings and engine args).
"""

import os as _os

# OpenMP threads that sleep as soon as they wait, unless the environment says otherwise. libgomp
# reads this once, when torch loads it, so it is set before anything here imports torch (the
# engine's child process inherits it). With libgomp's default spin-waiting, a thread preempted by
# another process stalls every parallel region's barrier: served on a 2-core EPYC at load 5-6,
# concurrency 1 gave 1.5-2.7 output tok/s spinning and 15.4 passive (docs/benchmarks.md,
# "AVX2-only CPUs").
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
