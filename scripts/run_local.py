"""The main job on one host, from a checkout: `a3c-train` (a3c_http/cli/train.py, see --help)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from a3c_http.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
