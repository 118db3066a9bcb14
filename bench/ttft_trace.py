"""Where a follow-up's time to first token goes, from the server's side: `serve` runs `pyqsa serve`
(the same arguments) with the engine's methods wrapped to record timestamps (submit, admit, the
prefix start, every step's chunks and forward pass, snapshots, waits for row copies, the first
token emitted and delivered), written as JSON to $TRACE_OUT at exit (SIGINT or SIGTERM);
`report TRACE HISTORY` prints, per request whose prompt is longer than HISTORY tokens, the
seconds of each part: submit (conversion and hashes), inbox (the engine busy in a step),
slot_wait, start (resume or restore, copy waits included), its forward passes until the first
token, and emit to delivery; then the engine thread's snapshots and resumes on their own.
A dev tool: it wraps private methods, so it follows their names.

    TRACE_OUT=trace.json python bench/ttft_trace.py serve --slots 4 --ctx 32768 ... &
    python bench/agents.py http://127.0.0.1:8000 --agents 4 --history-tokens 20000 ...
    kill -INT %1; python bench/ttft_trace.py report trace.json 20000
"""

import atexit
import json
import os
import signal
import statistics
import sys
import time

from pyqsa.engine import engine as E
from pyqsa.engine import prefix_reuse as PR
from pyqsa.engine import prefix_rows as RW
from pyqsa.engine import scheduler as S

T = []  # (t, kind, request_id, extra)
now = time.perf_counter


def ev(kind, rid=None, **kw):
    T.append((now(), kind, rid, kw))


def wrap(cls, name, after):
    f = getattr(cls, name)

    def g(self, *a, **k):
        t0 = now()
        r = f(self, *a, **k)
        t1 = now()
        after(self, a, k, r, t0, t1)
        return r

    setattr(cls, name, g)


wrap(
    E.Engine,
    "submit",
    after=lambda s, a, k, r, t0, t1: ev("submit", r, t0=t0, dt=t1 - t0, n=len(a[0])),
)
wrap(
    E.Engine,
    "_admit",
    after=lambda s, a, k, r, t0, t1: ev("admit", a[0].request_id, reply=a[0].reply_of is not None),
)
wrap(
    PR.PrefixReuse,
    "start",
    after=lambda s, a, k, r, t0, t1: ev(
        "start", a[0].request_id, t0=t0, dt=t1 - t0, n=a[0].num_computed_tokens
    ),
)
wrap(
    PR.PrefixReuse,
    "snapshot",
    after=lambda s, a, k, r, t0, t1: ev("snapshot", a[0].request_id, t0=t0, dt=t1 - t0),
)
wrap(
    RW.RowCopier,
    "wait",
    after=lambda s, a, k, r, t0, t1: ev("copywait", None, slot=a[0], t0=t0, dt=t1 - t0),
)
wrap(
    S.Scheduler,
    "schedule",
    after=lambda s, a, k, r, t0, t1: ev(
        "step",
        None,
        t0=t0,
        dt=t1 - t0,
        chunks=[(c.request.request_id, c.start, len(c.tokens)) for c in r],
    ),
)


def _emit_after(s, a, k, r, t0, t1):
    req, e = a
    if isinstance(e, E.Delta):
        ev("emit", req.request_id, text=bool(e.text))
    else:
        ev("finish", req.request_id)


wrap(E.Engine, "_emit", after=_emit_after)
wrap(E.Engine, "_deliver", after=lambda s, a, k, r, t0, t1: ev("deliver", None, t0=t0, dt=t1 - t0))


def _patch_runner():
    from pyqsa.engine import runner as R

    wrap(
        R.LlamaRunner,
        "run",
        after=lambda s, a, k, r, t0, t1: ev("forward", None, t0=t0, dt=t1 - t0),
    )
    wrap(
        R.LlamaRunner,
        "resume",
        after=lambda s, a, k, r, t0, t1: ev("resume", None, t0=t0, dt=t1 - t0),
    )


_patch_runner()


def dump():
    with open(os.environ.get("TRACE_OUT", "/tmp/m/trace.json"), "w") as f:
        json.dump(T, f)


def report(path: str, hist: int) -> None:
    T = json.load(open(path))

    by = {}
    for t, kind, rid, kw in T:
        if rid is not None:
            by.setdefault(rid, []).append((t, kind, kw))
    steps = [(t, kw) for t, kind, rid, kw in T if kind == "step"]
    fwd = [(t, kw) for t, kind, rid, kw in T if kind == "forward"]
    snaps = [(t, rid, kw) for t, kind, rid, kw in T if kind == "snapshot"]
    dels = [(t, kw) for t, kind, rid, kw in T if kind == "deliver"]
    waits = [(t, kw) for t, kind, rid, kw in T if kind == "copywait"]
    rows = []
    for rid, evs in by.items():
        d = {}
        for t, kind, kw in evs:
            d.setdefault(kind, (t, kw))
        if "submit" not in d or d["submit"][1]["n"] <= hist:
            continue
        sub_t0 = d["submit"][1]["t0"]
        sub_end = d["submit"][0]
        adm = d["admit"][0]
        st0 = d["start"][1]["t0"]
        st1 = d["start"][0]
        emit = d["emit"][0]
        deliver = min(t for t, kw in dels if kw["t0"] >= emit)
        first_step = min(kw["t0"] for t, kw in steps if any(c[0] == rid for c in kw["chunks"]))
        my_fwd = [kw["dt"] for t, kw in fwd if first_step <= kw["t0"] <= emit]
        # between admit and start: forward passes and snapshots of other requests
        busy_fwd = sum(kw["dt"] for t, kw in fwd if adm <= kw["t0"] and t <= st0)
        busy_snap = sum(kw["dt"] for t, r, kw in snaps if adm <= kw["t0"] and t <= st0)
        replies = {
            c[0]
            for t, kw in steps
            if adm <= kw["t0"] <= st0
            for c in kw["chunks"]
            if "/reply" in c[0]
        }
        cw = sum(kw["dt"] for t, kw in waits if st0 <= kw["t0"] <= st1)
        rows.append(
            dict(
                rid=rid,
                n=d["submit"][1]["n"],
                submit=sub_end - sub_t0,
                inbox=adm - sub_end,
                slot_wait=st0 - adm,
                of_which_fwd=busy_fwd,
                of_which_snap=busy_snap,
                replies_between=len(replies),
                start=st1 - st0,
                copywait=cw,
                to_first_step=first_step - st1,
                prefill_fwd=sum(my_fwd),
                n_fwd=len(my_fwd),
                emit_to_deliver=deliver - emit,
                server_ttft=deliver - sub_t0,
            )
        )
    rows.sort(key=lambda r: r["n"])
    keys = [k for k in rows[0] if k not in ("rid",)]
    print(" ".join(f"{k[:10]:>10}" for k in keys))
    for r in rows:
        print(" ".join(f"{r[k]:10.4f}" if isinstance(r[k], float) else f"{r[k]:>10}" for k in keys))
    print("median:")
    print(" ".join(f"{statistics.median(r[k] for r in rows):10.4f}" for k in keys))
    # the engine thread's head copies on their own: a follow-up's snapshot is taken after its
    # first token, on a device already done with the pass (others, inside long prompts, also
    # wait for the pass before them)
    follow = {r["rid"] for r in rows}
    resumes = [kw["dt"] for t, kind, rid, kw in T if kind == "resume"]
    for label, dts in (
        ("follow-ups' own snapshots", [kw["dt"] for t, r, kw in snaps if r in follow]),
        ("every snapshot", [kw["dt"] for t, r, kw in snaps]),
        ("resumes", resumes),
    ):
        if dts:
            ms = sorted(1e3 * x for x in dts)
            print(
                f"{label}: {len(ms)}, median {statistics.median(ms):.1f} ms "
                f"({ms[0]:.1f}-{ms[-1]:.1f})"
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["report"]:
        report(sys.argv[2], int(sys.argv[3]))
    else:
        from pyqsa.cli import main

        atexit.register(dump)
        # uvicorn raises the signal it stopped for again once it has shut down: exit through
        # SystemExit there, so that atexit writes the trace
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        sys.argv = ["pyqsa", *sys.argv[1:]]
        main()
