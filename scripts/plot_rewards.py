"""Plot runs' returns, from a checkout: `a3c-plot` (a3c_http/cli/plot.py, see --help)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from a3c_http.cli.plot import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
