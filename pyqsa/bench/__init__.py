"""Benchmarks: `pyqsa bench` (cli.py) and the bench/ scripts, one implementation.

Each scenario is measured and reported on its own, never summed with another: steps (decode.py),
server (serve_ttft.py, serve_load.py), capacity (ledger.py), long (mission.py), prefix
(agents.py). report.py makes the plots and the README's results block from the recorded files.
"""
