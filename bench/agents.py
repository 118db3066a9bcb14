"""bench/agents.py: the prefix cache's agent scenario against a running pyqsa serve.

The code is pyqsa.bench.agents (its docstring has the options), which `pyqsa bench` runs too."""

import sys

from pyqsa.bench.agents import main

if __name__ == "__main__":
    sys.exit(main())
