"""`python -m app ...` is the trtllm-gateway command."""

import sys

from app.cli import main

sys.exit(main())
