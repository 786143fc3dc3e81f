"""``python -m mirror_core.cli …``: the ``shoal`` command."""

import sys

from mirror_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
