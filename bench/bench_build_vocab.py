"""`bert build-vocab` on the shared books: build time, and [UNK] rate and pieces per word on held-out books
against the released uncased vocab and `tokenizers`' own BERT WordPiece trainer (the peer).

Run from the repository root (the data lives in the `shared` folder beside it):

    python bench/bench_build_vocab.py                    # about 3 minutes on 2 busy cores
    python bench/bench_build_vocab.py --results out.md   # also write the table as markdown

1. Time: a 30522-entry uncased vocab from the whole corpus (`shared/data/corpus/*/*.gz`, 106 books, 68 MB),
   default flags, wall and CPU seconds (CPU: this process's threads, the Rust trainer's included).
2. Quality: every 10th book (sorted paths) is held out; `bert build-vocab` and the peer learn 30522-entry
   vocabs from the other books; the held-out books are tokenized by our `FullTokenizer` (the original's
   WordPiece) with each vocab and with the released uncased vocab. [UNK] rate = share of basic-tokenizer
   words that become [UNK]; pieces per word = WordPiece tokens per basic-tokenizer word.
   The peer is `tokenizers.BertWordPieceTokenizer.train_from_iterator` (lower-casing and accent stripping
   in Rust, its own defaults: min_frequency 2, limit_alphabet 1000), fed the same lines in batches.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bert.commands.build_vocab import BuildVocabArgs, run_build_vocab
from bert.tokenization import load_vocab
from bert.utils import iter_lines
from bert.vocab import count_words, coverage

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
VOCAB_SIZE = 30522


def machine() -> str:
    model, flags = "unknown CPU", ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                present = set(line.split(":", 1)[1].split())
                flags = " ".join(f for f in ("avx2", "avx512f", "fma", "sha_ni") if f in present)
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()}-core {model} ({platform.machine()}; flags {flags or 'n/a'}), load average {load:.1f} "
        f"at the end, Python {platform.python_version()}"
    )


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def ours(files: list[Path], output: Path, heldout: list[Path] | None = None) -> tuple[dict, float, float]:
    args = BuildVocabArgs(
        input_file=",".join(map(str, files)),
        output_file=str(output),
        vocab_size=VOCAB_SIZE,
        heldout_file=",".join(map(str, heldout)) if heldout else None,
    )
    return timed(lambda: run_build_vocab(args))


def peer(files: list[Path], output_dir: Path) -> tuple[Path, float, float]:
    from tokenizers import BertWordPieceTokenizer

    def batches():
        for path in files:
            lines = iter_lines(str(path))
            while batch := list(itertools.islice(lines, 4096)):
                yield "\n".join(batch)

    def train():
        tokenizer = BertWordPieceTokenizer(lowercase=True)
        tokenizer.train_from_iterator(batches(), vocab_size=VOCAB_SIZE, show_progress=False)
        output_dir.mkdir(parents=True, exist_ok=True)
        return Path(tokenizer.save_model(str(output_dir))[0])

    return timed(train)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bert-bench-build-vocab"))
    parser.add_argument("--results", default=None, help="also write the table as markdown to this file")
    opts = parser.parse_args()
    work = Path(opts.work_dir)
    books = sorted((SHARED / "corpus").glob("*/*.gz"))
    if not books:
        sys.exit(f"no books under {SHARED / 'corpus'}: the shared data folder must be beside the repository")
    heldout = books[::10]
    train = [b for b in books if b not in heldout]
    mb = lambda paths: sum(os.path.getsize(p) for p in paths) / 1e6  # noqa: E731

    full, full_wall, full_cpu = ours(books, work / "full" / "vocab.txt")
    print(
        f"whole corpus: {full['words']:,} words ({full['distinct_words']:,} distinct) -> {full['vocab_size']} "
        f"entries in {full_wall:.1f} s wall, {full_cpu:.1f} s CPU (reading {full['read_seconds']:.1f} s, "
        f"training {full['train_seconds']:.1f} s)",
        flush=True,
    )
    split, split_wall, split_cpu = ours(train, work / "split" / "vocab.txt", heldout)
    peer_vocab, peer_wall, peer_cpu = peer(train, work / "peer")
    heldout_counts = count_words([str(p) for p in heldout], True, desc=None)
    rows = [
        ("`bert build-vocab`", "90% of the books", split_wall, split_cpu, split["heldout"]),
        (
            "`tokenizers` BertWordPieceTokenizer",
            "90% of the books",
            peer_wall,
            peer_cpu,
            coverage(load_vocab(peer_vocab), heldout_counts),
        ),
        (
            "released uncased",
            "Wikipedia + BooksCorpus",
            None,
            None,
            coverage(load_vocab(SHARED / "vocab" / "uncased.txt"), heldout_counts),
        ),
    ]
    lines = [
        f"Held out: {len(heldout)} of {len(books)} books (every 10th), {rows[0][4]['words']:,} words; trained on "
        f"the other {len(train)} ({mb(train):.1f} MB gzipped). Vocab size {VOCAB_SIZE} each.",
        "",
        "| vocab | trained on | build wall s | build CPU s | held-out [UNK] words | held-out pieces/word |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, data, wall, cpu, cov in rows:
        w = f"{wall:.1f}" if wall is not None else "-"
        c = f"{cpu:.1f}" if cpu is not None else "-"
        lines.append(f"| {name} | {data} | {w} | {c} | {100 * cov['unk_rate']:.4f}% | {cov['pieces_per_word']:.4f} |")
    lines += [
        "",
        f"Build time vs the peer (same books, same run): {split_wall / peer_wall:.2f}x its wall time, "
        f"{split_cpu / peer_cpu:.2f}x its CPU time.",
        f"Whole corpus ({len(books)} books, {full['words']:,} words): {full_wall:.1f} s wall, {full_cpu:.1f} s CPU "
        f"(reading and basic tokenization {full['read_seconds']:.1f} s, "
        f"WordPiece training {full['train_seconds']:.1f} s).",
        f"Machine: {machine()}.",
    ]
    text = "\n".join(lines)
    print(text)
    if opts.results:
        Path(opts.results).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
