"""Prometheus metrics: engine figures read at scrape time, plus what only the server sees."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pyqsa.engine import Engine
from pyqsa.engine.prefix_reuse import PrefixStats


class _EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()
        yield GaugeMetricFamily("pyqsa_slots", "Slots (sequences) of the engine", s.n_slots)
        yield GaugeMetricFamily("pyqsa_busy_slots", "Slots leased to a request", s.busy_slots)
        yield GaugeMetricFamily("pyqsa_queue_length", "Requests waiting for a slot", s.waiting)
        yield GaugeMetricFamily(
            "pyqsa_requests_in_flight", "Requests submitted and not finished", s.in_flight
        )
        yield GaugeMetricFamily(
            "pyqsa_tokens_per_second", "Generated tokens per second, recent", s.tokens_per_second
        )
        yield CounterMetricFamily(
            "pyqsa_prompt_tokens", "Prompt tokens computed", value=s.prompt_tokens
        )
        yield CounterMetricFamily(
            "pyqsa_generated_tokens", "Tokens generated", value=s.generated_tokens
        )
        finished = CounterMetricFamily(
            "pyqsa_requests_finished", "Finished requests by reason", labels=["reason"]
        )
        for reason, n in s.finished.items():
            finished.add_metric([reason], n)
        yield finished
        yield CounterMetricFamily("pyqsa_engine_steps", "Forward passes run", value=s.steps)
        step_seconds = CounterMetricFamily(
            "pyqsa_engine_step_seconds",
            "Engine step time: forward (the model) or host (scheduling, sampling, events); "
            "launch is the part of forward until the pass got under way",
            labels=["part"],
        )
        for part, seconds in s.step_seconds.items():
            step_seconds.add_metric([part], seconds)
        yield step_seconds
        if "reused" in s.graphs:
            yield CounterMetricFamily(
                "pyqsa_graph_reuses",
                "Forward passes that kept the previous pass's graph (llama.cpp built none)",
                value=s.graphs["reused"],
            )
        if "captured" in s.graphs:
            cuda = CounterMetricFamily(
                "pyqsa_cuda_graph_computes",
                "Graph computes on CUDA: direct (kernel by kernel: graphs off, warming up, or the "
                "graph changed), captured into a CUDA graph, replayed from one",
                labels=["how"],
            )
            for how in ("direct", "captured", "replayed"):
                cuda.add_metric([how], s.graphs[how])
            yield cuda
        if limit := self.engine.config.device_memory_limit:
            yield GaugeMetricFamily(
                "pyqsa_device_memory_limit_bytes",
                "Device memory the server may hold (serve --gpu-memory, or what was free)",
                limit,
            )
        if s.ledger:
            ledger = GaugeMetricFamily(
                "pyqsa_ledger_bytes", "Memory held by category (paging ledger)", labels=["category"]
            )
            for category, n in s.ledger.items():
                ledger.add_metric([category], n)
            yield ledger
        if s.prefix is not None:
            yield from _prefix_metrics(s.prefix)
        if s.paging is not None:
            p = s.paging
            yield CounterMetricFamily(
                "pyqsa_paging_hits", "Selected K/V blocks found in the hot cache", value=p["hits"]
            )
            yield CounterMetricFamily(
                "pyqsa_paging_misses",
                "K/V blocks fetched from the host store into the hot cache",
                value=p["misses"],
            )
            yield CounterMetricFamily(
                "pyqsa_paging_staged",
                "K/V blocks staged from the host store for prompt chunks",
                value=p["staged"],
            )
            moved = CounterMetricFamily(
                "pyqsa_paging_bytes",
                "K/V bytes moved by paging: fetched and staged to the device, written to the "
                "host store",
                labels=["direction"],
            )
            moved.add_metric(["to_device"], p["bytes_to_device"])
            moved.add_metric(["to_host"], p["bytes_to_host"])
            yield moved
            if s.paging_layers:
                per_layer = {
                    what: CounterMetricFamily(
                        f"pyqsa_paging_layer_{what}",
                        f"Selected K/V blocks {text}, per QSA layer",
                        labels=["layer"],
                    )
                    for what, text in (("hits", "found in the hot cache"), ("misses", "fetched"))
                }
                for il, (hits, misses) in sorted(s.paging_layers.items()):
                    per_layer["hits"].add_metric([str(il)], hits)
                    per_layer["misses"].add_metric([str(il)], misses)
                yield from per_layer.values()
            yield GaugeMetricFamily(
                "pyqsa_paging_hot_blocks",
                "Hot cache blocks per slot and QSA layer",
                p["hot_blocks"],
            )


def _prefix_metrics(p: PrefixStats) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "pyqsa_prefix_cache_hit_tokens",
        "Prompt tokens whose state came from the prefix cache",
        value=p.hit_tokens,
    )
    yield CounterMetricFamily(
        "pyqsa_prefix_cache_miss_tokens",
        "Prompt tokens not found in the prefix cache (computed)",
        value=p.miss_tokens,
    )
    yield GaugeMetricFamily(
        "pyqsa_prefix_cache_bytes", "Host memory held by the prefix cache", p.bytes
    )
    yield GaugeMetricFamily("pyqsa_prefix_cache_entries", "Prefixes in the prefix cache", p.entries)
    yield CounterMetricFamily(
        "pyqsa_prefix_cache_evicted", "Prefixes evicted from the prefix cache", value=p.evicted
    )
    starts = CounterMetricFamily(
        "pyqsa_prefix_cache_starts",
        "Requests started after a cached prefix: in place in the slot holding it (continue), "
        "its state resumed there (resume), or loaded into another slot (restore)",
        labels=["how"],
    )
    for how, n in p.starts.items():
        starts.add_metric([how], n)
    yield starts
    yield GaugeMetricFamily(
        "pyqsa_prefix_cache_pending_copies",
        "Snapshot row segments the copier thread has still to copy",
        p.pending_copies,
    )
    yield CounterMetricFamily(
        "pyqsa_prefix_cache_copy_seconds",
        "Seconds the copier thread spent copying snapshots' rows and staged heads",
        value=p.copy_seconds,
    )
    yield CounterMetricFamily(
        "pyqsa_prefix_cache_engine_seconds",
        "Seconds the engine thread spent taking snapshots' heads, resuming and restoring states "
        "(every slot waits meanwhile)",
        value=p.engine_seconds,
    )
    yield CounterMetricFamily(
        "pyqsa_prefix_cache_snapshots",
        "Snapshots' heads taken on the engine thread (their rows go to the copier thread)",
        value=p.snapshots,
    )
    yield CounterMetricFamily(
        "pyqsa_prefix_cache_snapshots_staged",
        "Snapshots whose head's recurrent state the engine thread staged in pinned memory for the "
        "copier thread (the others were copied into their heads on the engine thread)",
        value=p.staged,
    )


class Metrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.open_requests = Gauge(
            "pyqsa_http_open_requests",
            "Completion requests the server is answering",
            registry=self.registry,
        )
        self.refused = Counter(
            "pyqsa_http_refused",
            "Completion requests refused before reaching the engine",
            ["status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "pyqsa_time_to_first_token_seconds",
            "From request arrival to the first generated token",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
