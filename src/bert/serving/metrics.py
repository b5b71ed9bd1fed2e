"""The server's Prometheus metrics (`GET /metrics`): request counters by route and status, errors by kind,
inputs and tokens run, batch sizes and latencies as histograms, written in Prometheus' text format by hand
(no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        tail = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{tail} {self.sum:.6g}", f"{name}_count{tail} {self.count}"]


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Counters and histograms, written in Prometheus' text format by hand (no client library needed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.inputs = 0
        self.tokens = 0
        self.batch_size = _Histogram((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.batch_tokens = _Histogram((64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536))
        self.latency: dict[str, _Histogram] = {}

    def request(self, route: str, status: int, seconds: float, error_type: str | None) -> None:
        with self._lock:
            self.requests[route, status] += 1
            if error_type is not None:
                self.errors[route, error_type] += 1
            self.latency.setdefault(route, _Histogram(_LATENCY_BUCKETS)).observe(seconds)

    def batch(self, inputs: int, tokens: int) -> None:
        with self._lock:
            self.inputs += inputs
            self.tokens += tokens
            self.batch_size.observe(inputs)
            self.batch_tokens.observe(tokens)

    def render(self, queue_depth: int) -> str:
        with self._lock:
            out = [
                "# HELP bert_requests_total HTTP requests by route and status.",
                "# TYPE bert_requests_total counter",
            ]
            out += [
                f'bert_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())
            ]
            out += [
                "# HELP bert_errors_total Failed requests by route and error type.",
                "# TYPE bert_errors_total counter",
            ]
            out += [
                f'bert_errors_total{{route="{r}",error_type="{t}"}} {n}' for (r, t), n in sorted(self.errors.items())
            ]
            out += ["# HELP bert_inputs_total Inputs run by the model.", "# TYPE bert_inputs_total counter"]
            out += [f"bert_inputs_total {self.inputs}"]
            out += ["# HELP bert_tokens_total WordPiece tokens run by the model.", "# TYPE bert_tokens_total counter"]
            out += [f"bert_tokens_total {self.tokens}"]
            out += ["# HELP bert_queue_depth Inputs waiting for the model.", "# TYPE bert_queue_depth gauge"]
            out += [f"bert_queue_depth {queue_depth}"]
            out += ["# HELP bert_batch_size Inputs per model batch.", "# TYPE bert_batch_size histogram"]
            out += self.batch_size.lines("bert_batch_size")
            out += ["# HELP bert_batch_tokens Tokens per model batch.", "# TYPE bert_batch_tokens histogram"]
            out += self.batch_tokens.lines("bert_batch_tokens")
            out += [
                "# HELP bert_request_duration_seconds Request latency by route.",
                "# TYPE bert_request_duration_seconds histogram",
            ]
            for route, h in sorted(self.latency.items()):
                out += h.lines("bert_request_duration_seconds", f'route="{route}"')
        return "\n".join(out) + "\n"
