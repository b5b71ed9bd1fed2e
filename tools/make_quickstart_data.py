"""Rebuild the quickstart's built-in data in src/bert/data/quickstart/ from ../shared/data (run by hand).

    python tools/make_quickstart_data.py

Pre-training corpus: two Project Gutenberg novels (public domain), Austen's "Pride and Prejudice" and
Dickens's "Hard Times", through `bert prepare-corpus --split_chapters=true` (one sentence per line, a
blank line between chapters). Classification set: "who wrote this sentence?", sentences of 8 to 60 words
from two other novels of the same authors, "Sense and Sensibility" and "Bleak House", balanced, shuffled
with seed 12345: 2,000 for training and 500 for evaluation. Vocab: BERT's uncased WordPiece vocab
(google-research/bert, Apache-2.0).
"""

import gzip
import random
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
OUT = REPO / "src" / "bert" / "data" / "quickstart"


def prepare(book: str, tmp: Path) -> Path:
    out = tmp / f"{book}.txt"
    src = SHARED / "corpus" / "british-novels" / f"{book}.txt.gz"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bert",
            "prepare-corpus",
            f"--input_file={src}",
            f"--output_file={out}",
            "--split_chapters=true",
        ],
        check=True,
    )
    return out


def sentences(path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [s for s in lines if 8 <= len(s.split()) <= 60 and "\t" not in s]


def main() -> None:
    tmp = OUT / "_tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    with gzip.open(OUT / "corpus.txt.gz", "wt", encoding="utf-8", compresslevel=9) as f:
        for book in ("Austen_Pride", "Dickens_Hard"):
            f.write(prepare(book, tmp).read_text(encoding="utf-8").rstrip("\n") + "\n\n")
    rng = random.Random(12345)
    rows = []
    for book, label in (("Austen_Sense", "austen"), ("Dickens_Bleak", "dickens")):
        picked = sentences(prepare(book, tmp))
        rng.shuffle(picked)
        rows += [(s, label) for s in picked[:1250]]
    rng.shuffle(rows)
    for name, part in (("train.tsv", rows[:2000]), ("dev.tsv", rows[2000:2500])):
        with gzip.open(OUT / f"{name}.gz", "wt", encoding="utf-8", compresslevel=9) as f:
            f.write("sentence\tlabel\n")
            f.writelines(f"{s}\t{label}\n" for s, label in part)
    with open(SHARED / "vocab" / "uncased.txt", "rb") as src, gzip.open(OUT / "vocab.txt.gz", "wb", 9) as dst:
        shutil.copyfileobj(src, dst)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
