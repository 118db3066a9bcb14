"""bench/mission.py: the mission load's phases (tests/gpu/mission.sh).

The code is pyqsa.bench.mission (its docstring has the options), which `pyqsa bench` runs too."""

import sys

from pyqsa.bench.mission import main

if __name__ == "__main__":
    sys.exit(main())
