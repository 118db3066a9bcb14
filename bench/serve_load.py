"""bench/serve_load.py: concurrent completions against a running pyqsa serve.

The code is pyqsa.bench.serve_load (its docstring has the options), which `pyqsa bench` runs too."""

import sys

from pyqsa.bench.serve_load import main

if __name__ == "__main__":
    sys.exit(main())
