"""``python -m mirror_core.daemon --config pipeline.yaml``: the command deployments run (kept across the move)."""

import sys

from mirror_core.daemon.main import main

if __name__ == "__main__":
    sys.exit(main())
