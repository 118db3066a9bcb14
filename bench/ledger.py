"""bench/ledger.py: device and host bytes by category of a context opened at a shape.

The code is pyqsa.bench.ledger (its docstring has the options), which `pyqsa bench` runs too."""

import sys

from pyqsa.bench.ledger import main

if __name__ == "__main__":
    sys.exit(main())
