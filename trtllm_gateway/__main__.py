"""`python -m trtllm_gateway serve ...`: the same command line as the trtllm-gateway script."""

from trtllm_gateway.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
