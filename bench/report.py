"""bench/report.py: tables from decode.py's JSON lines and the results file.

The code is pyqsa.bench.decode_report (its docstring has the options), which `pyqsa bench`
runs too."""

import sys

from pyqsa.bench.decode_report import main

if __name__ == "__main__":
    sys.exit(main())
