"""bench/decode.py: decode and prefill throughput of one library and model, JSON lines.

The code is pyqsa.bench.decode (its docstring has the options), which `pyqsa bench` runs too."""

import sys

from pyqsa.bench.decode import main

if __name__ == "__main__":
    sys.exit(main())
