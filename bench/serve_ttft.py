"""bench/serve_ttft.py: idle time to first token of a running pyqsa serve.

The code is pyqsa.bench.serve_ttft (its docstring has the options), which `pyqsa bench` runs too."""

import sys

from pyqsa.bench.serve_ttft import main

if __name__ == "__main__":
    sys.exit(main())
