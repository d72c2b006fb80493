# syntax=docker/dockerfile:1
# trtllm-gateway images. Two targets:
#   docker build --target trtllm  -t trtllm-gateway:trtllm .   # TensorRT-LLM 1.2 (NGC), GPU
#   docker build --target builtin -t trtllm-gateway:builtin .  # built-in engine, slim base
# Both run from the repository root (WORKDIR) so the package `trtllm_gateway` imports without
# installing the project as a wheel.

ARG TRTLLM_IMAGE=nvcr.io/nvidia/tensorrt-llm/release:1.2.0

# ---------------------------------------------------------------------------------------------
# trtllm: TensorRT-LLM (and its torch) come preinstalled in the NGC release image; only the
# gateway's own pure-Python dependencies are added, never torch or tensorrt_llm.
FROM ${TRTLLM_IMAGE} AS trtllm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 GATEWAY_HOST=0.0.0.0 GATEWAY_PORT=8000 GATEWAY_ENGINE=trtllm
WORKDIR /opt/trtllm-gateway
RUN python3 -m pip install \
        "fastapi>=0.115" "uvicorn>=0.30" "sse-starlette>=2.1" "prometheus-client>=0.20" \
        "prometheus-fastapi-instrumentator>=7.0" "pydantic-settings>=2.4" "httpx>=0.27" \
        "pillow>=10.0" "blake3>=0.4" "pyyaml>=6.0" "jinja2>=3.1" "gguf>=0.10" \
        "msgspec>=0.18" "pyzmq>=25.0" "llguidance>=1.9" \
    && useradd --create-home --uid 10001 gateway
COPY --chown=gateway:gateway trtllm_gateway ./trtllm_gateway
USER gateway
EXPOSE 8000
# Loading a large model takes minutes: /health is 503 until the engine is ready.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD python3 -c "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('GATEWAY_PORT','8000'), timeout=4)"
CMD ["python3", "-m", "trtllm_gateway", "serve", "--engine", "trtllm", "--host", "0.0.0.0"]

# ---------------------------------------------------------------------------------------------
# builtin: the built-in PyTorch engine on a slim Python base (CPU torch unless the
# constraints file pins a CUDA build). Dependencies first, from the constraints file, so
# source edits do not reinstall them.
FROM python:3.11-slim AS builtin
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    GATEWAY_HOST=0.0.0.0 GATEWAY_PORT=8000
WORKDIR /opt/trtllm-gateway
COPY pyproject.toml constraints.txt ./
# g++ builds the CPU kernels (engine/builtin/cpu_kernels) below, every x86 variant, so a start
# picks the one its CPU runs and never compiles; without it the engine keeps dense float32 matmuls.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
RUN python -c "import tomllib; d=tomllib.load(open('pyproject.toml','rb')); open('/tmp/req.txt','w').write('\n'.join(d['project']['dependencies']))" \
    && pip install -c constraints.txt -r /tmp/req.txt \
    && useradd --create-home --uid 10001 gateway
COPY --chown=gateway:gateway trtllm_gateway ./trtllm_gateway
USER gateway
RUN python -m trtllm_gateway.engine.builtin.cpu_kernels.build --all
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD python -c "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('GATEWAY_PORT','8000'), timeout=4)"
CMD ["python", "-m", "trtllm_gateway", "serve", "--host", "0.0.0.0"]
