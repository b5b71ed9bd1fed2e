"""Tokenizer throughput: reference path vs fast path vs `tokenizers`' BertWordPieceTokenizer.

Run from the repository root (the data lives in the `shared` folder beside it):

    python bench/bench_tokenizer.py                  # both data sets, uncased vocab, ~2-3 minutes
    python bench/bench_tokenizer.py --repeats 1      # quicker, noisier

Data sets (every text is one line):
- corpus: the first `--corpus_mb` MB of `shared/data/corpus` (the gzipped books, decompressed and concatenated
  in sorted path order, cut at that many bytes);
- multilingual: every line of `shared/data/multilingual_sentences/*.txt` (75 languages), in sorted order.

MB/s counts UTF-8 bytes of input text, per second of wall time and per second of CPU time (this process's
threads plus finished child processes; it is the steadier number on a busy shared machine, and it charges
`tokenizers` for every thread it uses). Every fast-path timing starts from a fresh tokenizer (empty memo),
so it includes filling the memo; "warm" repeats the pass with the memo filled. The reference path is slow,
so it is timed on every `--ref_every`-th line (a uniform sample; its speed does not depend on what it saw
before) and the output says so. Each timing is the best of `--repeats` runs, because the machine is shared.
Ids are compared: fast vs reference (on the sample), batch vs single, and `tokenizers` vs fast (all lines).
Two more rows time the pieces with their characters' spans (`tokenize_with_offsets`, what late chunking and
NER's word spans run; its ids are checked too), and the character-by-character walk of the basic tokens that
it ran on every text before 2026-11-29 (now only on runs that are not printable ASCII).
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bert.tokenization import FullTokenizer

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


def load_corpus(mb: float) -> list[str]:
    limit = int(mb * 1_000_000)
    buf = bytearray()
    for path in sorted((SHARED / "corpus").glob("*/*.gz")):
        with gzip.open(path, "rb") as f:
            buf += f.read()
        if len(buf) >= limit:
            break
    return bytes(buf[:limit]).decode("utf-8", "ignore").split("\n")


def load_multilingual() -> list[str]:
    lines: list[str] = []
    for path in sorted((SHARED / "multilingual_sentences").glob("*.txt")):
        lines += path.read_text(encoding="utf-8").split("\n")
    return lines


def n_bytes(lines: list[str]) -> int:
    return sum(len(s.encode("utf-8")) for s in lines)


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its finished child processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def best_time(make: Callable[[], Callable[[], object]], repeats: int) -> tuple[float, float, object]:
    """Best wall time and best CPU time over `repeats` runs; `make()` builds a fresh runner, untimed."""
    best_wall = best_cpu = float("inf")
    out = None
    for _ in range(repeats):
        run = make()
        c0, t0 = cpu_seconds(), time.perf_counter()
        out = run()
        best_wall = min(best_wall, time.perf_counter() - t0)
        best_cpu = min(best_cpu, cpu_seconds() - c0)
    return best_wall, best_cpu, out


def bench(name: str, lines: list[str], vocab: Path, lower: bool, args: argparse.Namespace) -> list[str]:
    from tokenizers import BertWordPieceTokenizer

    mb = n_bytes(lines) / 1e6
    sample = lines[:: args.ref_every]
    mb_sample = n_bytes(sample) / 1e6
    print(f"\n== {name}: {len(lines)} lines, {mb:.2f} MB; vocab {vocab.name}, do_lower_case={lower}")

    def fast_tok() -> FullTokenizer:
        return FullTokenizer(vocab, do_lower_case=lower, fast=True)

    def per_line(tok: FullTokenizer, texts: list[str]) -> Callable[[], list[list[int]]]:
        return lambda: [tok.encode(s) for s in texts]

    def make_hf() -> Callable[[], list[list[int]]]:
        hf = BertWordPieceTokenizer(
            str(vocab), clean_text=True, handle_chinese_chars=True, strip_accents=lower, lowercase=lower
        )
        return lambda: [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]

    warm = fast_tok()
    warm.encode_batch(lines)
    runs = [  # (label, MB, runner factory, repeats)
        (
            f"reference path, encode() per line [every {args.ref_every}th line: {mb_sample:.2f} MB]",
            mb_sample,
            lambda: per_line(FullTokenizer(vocab, do_lower_case=lower, fast=False), sample),
            args.repeats,
        ),
        ("fast path, encode() per line, empty memo", mb, lambda: per_line(fast_tok(), lines), args.repeats),
        (
            "fast path, encode_batch(), empty memo",
            mb,
            lambda: (lambda t: lambda: t.encode_batch(lines))(fast_tok()),
            args.repeats,
        ),
        ("fast path, encode_batch(), memo already filled", mb, lambda: lambda: warm.encode_batch(lines), args.repeats),
    ]
    if args.workers > 1:
        runs.append(
            (
                f"fast path, encode_batch(num_workers={args.workers}), empty memo",
                mb,
                lambda: (lambda t: lambda: t.encode_batch(lines, num_workers=args.workers))(fast_tok()),
                args.repeats,
            )
        )
    runs.append(("tokenizers BertWordPieceTokenizer.encode_batch()", mb, make_hf, args.repeats))
    # Pieces with their characters (late chunking's spans, NER's words): printable-ASCII runs in one pass since
    # 2026-11-29, beside the character-by-character walk that every text took before.
    offsets = [
        ("fast path, tokenize_with_offsets() per line", lambda t: lambda: [t.tokenize_with_offsets(s) for s in lines]),
        (
            "  its basic tokens' spans character by character (before)",
            lambda t: lambda: [t.basic_tokenizer._spans_by_character(s) for s in lines],
        ),
    ]
    runs += [(label, mb, (lambda f: lambda: f(fast_tok()))(f), args.repeats) for label, f in offsets]

    results = []
    for label, size, make, repeats in runs:
        wall, cpu, out = best_time(make, repeats)
        results.append((label, size / wall, size / cpu, out))
    encodes = results[: -len(offsets)]  # the rows whose output is ids
    ref_wall, ref_ids = encodes[0][1], encodes[0][3]
    hf_wall, hf_ids = encodes[-1][1], encodes[-1][3]
    fast_ids = encodes[1][3]

    print(f"  {'':<72} {'wall MB/s':>9} {'CPU MB/s':>9} {'vs ref':>7} {'vs tokenizers':>13}")
    table = []
    for label, wall, cpu, _ in results:
        print(f"  {label:<72} {wall:9.2f} {cpu:9.2f} {wall / ref_wall:6.1f}x {wall / hf_wall:12.2f}x")
        table.append(f"| {name} | {label} | {wall:.2f} | {cpu:.2f} | {wall / ref_wall:.1f}x | {wall / hf_wall:.2f}x |")
    same_ref = fast_ids[:: args.ref_every] == ref_ids
    same_all = all(r[3] == fast_ids for r in encodes[1:-1])
    with_offsets = results[len(encodes)][3]  # the first of the offsets rows: tokenize_with_offsets
    same_all &= [[i for _, i, _, _ in line] for line in with_offsets] == fast_ids
    hf_diff = sum(a != b for a, b in zip(hf_ids, fast_ids))
    print(
        f"  ids: fast == reference on the sampled lines: {same_ref}; every fast variant identical: {same_all}; "
        f"tokenizers differs on {hf_diff} of {len(lines)} lines"
    )
    table.append(
        f"| {name} | ids | fast == reference: {'yes' if same_ref and same_all else 'NO'} | | | "
        f"tokenizers differs on {hf_diff}/{len(lines)} lines |"
    )
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus_mb", type=float, default=5.0)
    p.add_argument("--ref_every", type=int, default=5, help="time the reference path on every n-th line")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="also time encode_batch with this many processes")
    p.add_argument("--vocab", default="uncased", choices=["uncased", "cased", "chinese"])
    args = p.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"data not found: expected {SHARED} (the shared folder beside the repository)")
    import tokenizers

    vocab = SHARED / "vocab" / f"{args.vocab}.txt"
    lower = args.vocab != "cased"
    print(
        f"python {platform.python_version()}, tokenizers {tokenizers.__version__}, {os.cpu_count()} CPUs, "
        f"{platform.machine()}; load average {os.getloadavg()[0]:.2f}"
    )
    table = []
    table += bench(f"corpus (first {args.corpus_mb:g} MB)", load_corpus(args.corpus_mb), vocab, lower, args)
    table += bench("multilingual_sentences", load_multilingual(), vocab, lower, args)
    print("\nMarkdown:\n")
    print("| data | tokenizer | wall MB/s | CPU MB/s | vs reference (wall) | vs tokenizers (wall) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
