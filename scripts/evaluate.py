"""Play a run's weights, from a checkout: `a3c-evaluate` (a3c_http/cli/evaluate.py, see --help)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from a3c_http.cli.evaluate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
