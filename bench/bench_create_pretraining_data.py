"""Throughput and peak memory of `bert create-pretraining-data`: streaming against compat mode, in the same run.

Run from the repository root (the data lives in the `shared` folder beside it):

    python bench/bench_create_pretraining_data.py            # the 5 MB slice, every configuration (~2 min)
    python bench/bench_create_pretraining_data.py --full     # also the whole corpus (~68 MB) in streaming mode

Input: the books of `shared/data/corpus` in sorted path order, through `bert prepare-corpus --split_chapters`
(pysbd), cut after the last document that ends within the first 5,000,000 bytes; `--full` prepares every
book. The prepared text is cached in `--work_dir`. Settings: uncased vocab, `--max_seq_length=128
--dupe_factor=5` (the original's README example), other flags at their defaults.

Each configuration runs as its own `python -m bert create-pretraining-data` process. Peak RSS is the
largest sum of the resident sets of that process and its workers, sampled every 20 ms from /proc (so a
spike shorter than that can be missed), and `ru_maxrss` of the largest single process (from `wait4`). CPU
seconds are the user+system time of the process and its workers, the steadier number on a shared machine.

No ratio against the original `create_pretraining_data.py`: it needs TensorFlow, which this project does not
install, so it cannot be measured in the same run, and a time taken on another day under another load is not
a peer. The peer measured here is compat mode, the original algorithm in its original random order (its
output is tested record for record against the original's): each streaming row's ratio is compat's wall
(and CPU) seconds over its own, on the same corpus in the same run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
COMPAT = "compat (original algorithm), tfrecord"


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, from /proc."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1024


def run_measured(cmd: list[str]) -> dict:
    start = time.time()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        peak = [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _tree_rss_mb(proc.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (it waits for its workers)
        done.set()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.time() - start
        sampler.join()
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err.read()[-2000:].decode(errors='replace')}")
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak[0], "max_single_rss_mb": usage.ru_maxrss / 1024}


def prepare(work: Path, full: bool) -> tuple[Path, int]:
    """The prepared corpus (whole, or the 5 MB slice) and its size in bytes."""
    books = sorted((SHARED / "corpus").glob("*/*.txt.gz"))
    name = "corpus_full.txt" if full else "corpus_5mb.txt"
    out = work / name
    if not out.exists():
        if not full:  # only the books the slice needs (with a margin: prepared text is a bit shorter)
            need, size, chosen = 5_600_000, 0, []
            for b in books:
                chosen.append(b)
                with gzip.open(b, "rb") as f:
                    size += len(f.read())
                if size >= need:
                    break
            books = chosen
        listing = work / f"{name}.books"
        listing.write_text("\n".join(map(str, books)))
        prepared = work / f"{name}.prepared"
        subprocess.run(
            [sys.executable, "-m", "bert", "prepare-corpus", f"--input_file={','.join(map(str, books))}",
             f"--output_file={prepared}", "--split_chapters", "--num_workers=2"],
            check=True, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        data = prepared.read_bytes()
        if not full:
            data = data[: data.rfind(b"\n\n", 0, 5_000_000) + 2]
        out.write_bytes(data)
        prepared.unlink()
    return out, out.stat().st_size


def _spin(n: int) -> float:
    start = time.process_time()
    s = 0
    for i in range(n):
        s += i
    return time.process_time() - start


def effective_cores(n: int = 10_000_000) -> float:
    """How many CPU-bound processes actually run at once here: 2 x (time of one) / (time of two together)."""
    import multiprocessing

    start = time.time()
    _spin(n)
    one = time.time() - start
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_spin, [1000, 1000])  # start both workers first
        start = time.time()
        pool.map(_spin, [n, n])
        two = time.time() - start
    return 2 * one / two


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()}-core {model} ({platform.machine()}), load average {load:.1f} at the end, "
        f"Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bert-bench-pretraining-data"))
    parser.add_argument("--full", action="store_true", help="also the whole corpus, streaming mode")
    parser.add_argument("--results", default=None, help="also write the table as markdown to this file")
    opts = parser.parse_args()
    work = Path(opts.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    vocab = SHARED / "vocab" / "uncased.txt"

    slices = [prepare(work, full=False)]
    if opts.full:
        slices.append(prepare(work, full=True))
    configs = [
        # (label, extra flags, output name)
        (COMPAT, [], "out.tfrecord"),
        ("streaming, 1 worker, tfrecord", ["--streaming"], "out.tfrecord"),
        ("streaming, 2 workers, tfrecord", ["--num_workers=2"], "out.tfrecord"),
        ("streaming, 1 worker, native", ["--streaming"], "out_native"),
        ("streaming, 2 workers, native", ["--num_workers=2"], "out_native"),
    ]
    rows = []
    cores_before = effective_cores()
    for corpus, size in slices:
        full = corpus.name == "corpus_full.txt"
        for label, flags, out in configs:
            if full and label == COMPAT:
                continue  # holds the whole corpus in memory: the point of streaming
            cmd = [sys.executable, "-m", "bert", "create-pretraining-data", f"--input_file={corpus}",
                   f"--output_file={work / out}", f"--vocab_file={vocab}", "--max_seq_length=128",
                   "--dupe_factor=5", *flags]  # fmt: skip
            m = run_measured(cmd)
            stats_file = work / out / "stats.json" if "native" in out else work / f"{out}.stats.json"
            stats = json.loads(stats_file.read_text())
            row = {"corpus": corpus.name, "mb": size / 1e6, "config": label, "instances": stats["instances"], **m}
            row["mb_per_s"] = row["mb"] / m["wall_s"]
            compat = next((r for r in rows if r["corpus"] == corpus.name and r["config"] == COMPAT), None)
            row["vs_compat"] = compat["wall_s"] / m["wall_s"] if compat else None
            row["vs_compat_cpu"] = compat["cpu_s"] / m["cpu_s"] if compat else None
            rows.append(row)
            ratio = f"{row['vs_compat']:5.2f}x vs compat" if compat else "(no compat run on this corpus)"
            print(
                f"{row['corpus']:16s} {label:40s} {m['wall_s']:7.2f} s wall {m['cpu_s']:7.2f} s cpu "
                f"{row['mb_per_s']:6.2f} MB/s {ratio}  peak {m['peak_rss_mb']:6.0f} MB  "
                f"instances {stats['instances']}",
                flush=True,
            )
    cores = (cores_before + effective_cores()) / 2
    print(f"effective cores for two CPU-bound processes: {cores:.2f}")
    if opts.results:
        write_results(Path(opts.results), rows, cores)


def write_results(path: Path, rows: list[dict], cores: float) -> None:
    lines = [
        "# create-pretraining-data throughput and memory (`bench/bench_create_pretraining_data.py`)",
        "",
        f"**{time.strftime('%Y-%m-%d')}** · {machine()}. The machine is shared with other jobs, so wall times "
        "are noisy; CPU seconds (process + workers) are steadier.",
        "",
        "Settings: uncased vocab, `--max_seq_length=128 --dupe_factor=5`, other flags at their defaults. Input: "
        "`shared/data/corpus` books in sorted order through `bert prepare-corpus --split_chapters` (pysbd); the "
        "5 MB slice is cut at the last document boundary before 5,000,000 bytes. The peer is compat mode (the "
        "original algorithm and random order) measured in this run on the same corpus: vs compat = its seconds / "
        "ours, wall and CPU. The original `create_pretraining_data.py` needs TensorFlow, which is not installed, "
        "so it is not measured and no ratio against it is given.",
        "",
        "| corpus | MB | configuration | wall s | CPU s | MB/s (wall) | vs compat (wall) | "
        "vs compat (CPU s) | peak RSS MB (all processes) | largest process MB | instances |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        wall, cpu = ("-", "-") if r["vs_compat"] is None else (f"{r['vs_compat']:.2f}x", f"{r['vs_compat_cpu']:.2f}x")
        lines.append(
            f"| {r['corpus']} | {r['mb']:.2f} | {r['config']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
            f"{r['mb_per_s']:.2f} | {wall} | {cpu} | {r['peak_rss_mb']:.0f} | "
            f"{r['max_single_rss_mb']:.0f} | "
            f"{r['instances']:,} |"
        )
    by = {(r["corpus"], r["config"]): r for r in rows}
    full = any(r["corpus"] == "corpus_full.txt" for r in rows)
    one = by.get(("corpus_full.txt" if full else "corpus_5mb.txt", "streaming, 1 worker, native"))
    two = by.get(("corpus_full.txt" if full else "corpus_5mb.txt", "streaming, 2 workers, native"))
    lines += [
        "",
        "Notes:",
        f"- Parallelism available: two CPU-bound processes ran {cores:.2f}x as fast as one (probe: a pure-Python "
        "loop, mean of before and after the benchmark); other jobs used the rest of the 2 cores and the load "
        "varied during the run, so the 2-worker rows are not a clean measure of scaling.",
    ]
    if one and two:
        lines.append(
            f"- On {one['corpus']}, 2 workers took {two['wall_s']:.1f} s wall and {two['cpu_s']:.1f} CPU s, 1 worker "
            f"{one['wall_s']:.1f} s and {one['cpu_s']:.1f} CPU s. Each worker pays about 0.5 s to start (imports, "
            "vocab), and the 5 MB slice is only 2 buffers. A wall-clock gain from 2 workers needs two free cores; "
            "it was not measured here."
        )
    lines += [
        "- Streaming memory does not grow with the corpus (the full corpus is 13x the slice). Each process holds "
        "about 50 MB (Python, NumPy, vocab) plus its buffer's work (about 60 MB at the default "
        "`--streaming_buffer_mb=4`); the reader holds a window of 4 buffers of text. Each extra worker adds "
        "110-125 MB: 2 workers stay under 500 MB; 4 workers peaked at 585 MB on a 20 MB slice (measured once, "
        "by hand), so use a smaller `--streaming_buffer_mb` with many workers.",
        "- Compat mode is the original algorithm with the original random order (its output is tested record "
        "for record against the original's), with the memoised fast tokenizer and records serialized many at a "
        "time; like the original it holds the corpus and every instance in memory, so its peak grows with the "
        "corpus.",
        "- Streaming and compat draw from different random streams, hence slightly different instance counts "
        "on the same text; their statistics agree (tested).",
    ]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
