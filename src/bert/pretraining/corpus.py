"""Raw books to the input layout of `create-pretraining-data`: the library of `bert prepare-corpus`.

The original `create_pretraining_data.py` reads plain text with one sentence per line and a blank line
between documents (google-research/bert README, "Pre-training with BERT"), but ships no tool that
produces it. This module does, for raw text such as Project Gutenberg books (plain or gzipped):

1. the Project Gutenberg header and footer are dropped (everything up to the `*** START OF ... ***`
   line and from the `*** END OF ... ***` / `End of the Project Gutenberg EBook` line on);
2. hard-wrapped lines are joined into paragraphs (paragraphs are separated by blank lines), or, for
   files that hold one paragraph per line, each line is a paragraph (`paragraph_mode="auto"` decides
   per file from the line lengths);
3. each paragraph is split into sentences by a sentence splitter from PyPI (`pysbd`, rule based, the
   default; or `blingfire`, faster), imported only when used;
4. every source file becomes one document, or one document per chapter with `split_chapters`
   (a line such as "CHAPTER IV." or "Chapter 12" starts a new document and is itself dropped).
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import multiprocessing
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from bert.errors import InputError
from bert.utils import atomic_write, exit_with_parent, iter_lines

logger = logging.getLogger(__name__)

SENTENCE_SPLITTERS = ("pysbd", "blingfire")
PARAGRAPH_MODES = ("auto", "blank_line", "line")


# ------------------------------------------------------------------------------------------------
# Cleaning: Project Gutenberg boilerplate, paragraphs, chapters
# ------------------------------------------------------------------------------------------------

_GUTENBERG_START = re.compile(r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
_GUTENBERG_END = re.compile(
    r"^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.IGNORECASE
)
# How far into a file the START line is looked for (real headers are a few dozen lines long).
_HEADER_LOOKAHEAD = 1000

_NUMBER_WORDS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
    "seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|first|second|third|fourth|fifth|sixth|seventh|"
    "eighth|ninth|tenth|last"
)
_CHAPTER = re.compile(
    rf"^\s*chapter\s+(the\s+)?([ivxlcdm]+|\d+|({_NUMBER_WORDS})([\s-]+({_NUMBER_WORDS}))?)\b(?!')",
    re.IGNORECASE,
)
# A chapter heading is a short line; a long one starting with "Chapter one" is prose.
_CHAPTER_MAX_CHARS = 100

# `paragraph_mode=auto`: a file is hard-wrapped when nearly all its lines are at most this long
# (Project Gutenberg wraps at 70-76 characters).
_WRAP_WIDTH = 80
_MAX_PARAGRAPH_CHARS = 20_000
_SENTENCE_END = frozenset(".!?\"'”’)]")


def is_chapter_heading(line: str) -> bool:
    """True for a line such as "CHAPTER IV.", "Chapter 12: The Storm" or "CHAPTER THE FIRST"."""
    return len(line) <= _CHAPTER_MAX_CHARS and _CHAPTER.match(line) is not None


def strip_gutenberg(lines: Iterable[str]) -> Iterator[str]:
    """Drop a Project Gutenberg header (up to the START line) and footer (from the END line on).

    A file without a START line within its first 1000 lines is kept from its first line.
    """
    it = iter(lines)
    head: list[str] = []
    for line in it:
        if _GUTENBERG_START.match(line):
            head = []
            break
        if _GUTENBERG_END.match(line):
            yield from head
            return
        head.append(line)
        if len(head) >= _HEADER_LOOKAHEAD:
            break
    yield from head
    for line in it:
        if _GUTENBERG_END.match(line):
            return
        yield line


def _wrap_width(lines: list[str]) -> int | None:
    """The width a text is hard-wrapped at (95th percentile of line lengths), or None if it is not."""
    lengths = sorted(len(s.rstrip()) for s in lines if s.strip())
    if not lengths:
        return _WRAP_WIDTH
    width = lengths[int(0.95 * (len(lengths) - 1))]
    return width if width <= _WRAP_WIDTH else None


def iter_paragraphs(lines: Iterable[str], mode: str = "auto", split_chapters: bool = False) -> Iterator[str | None]:
    """Paragraphs as single-line strings; None marks a chapter break (only with `split_chapters`).

    Args:
        lines: the text's lines.
        mode: "blank_line": the text is hard-wrapped: consecutive lines are joined, and a paragraph ends
            at a blank line or after a line much shorter than the wrap width (some books have no blank
            lines); "line": every non-blank line is a paragraph; "auto": "blank_line" if 95% of the first
            2000 non-blank lines are at most 80 characters long, else "line".
        split_chapters: yield None in place of each chapter heading line.

    A paragraph is also cut after a line ending a sentence once it is longer than 20,000 characters, to
    bound the sentence splitter's work.
    """
    it = iter(lines)
    head: list[str] = []
    for line in it:
        head.append(line)
        if len(head) >= 2000:
            break
    width = _wrap_width(head)
    if mode == "auto":
        mode = "blank_line" if width is not None else "line"
    # In a wrapped paragraph every line but the last is nearly full: the next word did not fit.
    short = int(0.7 * (width or _WRAP_WIDTH))
    current: list[str] = []
    size = 0
    for line in _chain(head, it):
        stripped = line.strip()
        if split_chapters and stripped and is_chapter_heading(stripped):
            if current:
                yield " ".join(current)
                current, size = [], 0
            yield None
            continue
        if not stripped:
            if current:
                yield " ".join(current)
                current, size = [], 0
            continue
        current.append(stripped)
        size += len(stripped) + 1
        if (
            mode == "line"
            or len(line.rstrip()) < short
            or (size > _MAX_PARAGRAPH_CHARS and stripped[-1] in _SENTENCE_END)
        ):
            yield " ".join(current)
            current, size = [], 0
    if current:
        yield " ".join(current)


def _chain(head: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from rest


def make_sentence_splitter(name: str, flag: str = "--sentence_splitter") -> Callable[[str], list[str]]:
    """A function from a paragraph to its sentences, using the named PyPI package (imported here); `flag` is the
    flag that named it, for the errors.

    Raises:
        InputError: an unknown name, or the package is not installed (with the pip command).
    """
    if name == "pysbd":
        try:
            import pysbd
        except ImportError as e:
            raise InputError(
                f"{flag}=pysbd needs the pysbd package: pip install 'pysbd>=0.3.4,<0.4' (or use {flag}=blingfire)"
            ) from e
        segmenter = pysbd.Segmenter(language="en", clean=False)
        return segmenter.segment
    if name == "blingfire":
        try:
            import blingfire
        except ImportError as e:
            raise InputError(
                f"{flag}=blingfire needs the blingfire package: pip install 'blingfire>=0.1.8,<0.2' "
                f"(or use {flag}=pysbd)"
            ) from e
        return lambda text: blingfire.text_to_sentences(text).split("\n")
    raise InputError(f"{flag}={name!r} is not one of {', '.join(SENTENCE_SPLITTERS)}")


def _clean_sentence(sentence: str) -> str:
    # One line per sentence: every kind of whitespace (including line and paragraph separators)
    # becomes a single space.
    return " ".join(sentence.split())


def iter_documents(paragraphs: Iterable[str | None], split: Callable[[str], list[str]]) -> Iterator[list[str]]:
    """Group the sentences of `paragraphs` into documents, a new one at each None (chapter break).

    Empty documents (e.g. between two headings) are skipped.
    """
    doc: list[str] = []
    for para in paragraphs:
        if para is None:
            if doc:
                yield doc
                doc = []
            continue
        for sentence in split(para):
            sentence = _clean_sentence(sentence)
            if sentence:
                doc.append(sentence)
    if doc:
        yield doc


def prepare_file(
    path: str,
    split: Callable[[str], list[str]],
    split_chapters: bool = False,
    paragraph_mode: str = "auto",
    strip_boilerplate: bool = True,
    encoding: str = "utf-8",
    decode_errors: str = "strict",
) -> Iterator[list[str]]:
    """The documents (lists of sentences) of one raw text file."""
    lines: Iterable[str] = iter_lines(path, encoding, decode_errors, hint="--decode_errors=replace")
    if strip_boilerplate:
        lines = strip_gutenberg(lines)
    return iter_documents(iter_paragraphs(lines, paragraph_mode, split_chapters), split)


# ------------------------------------------------------------------------------------------------
# Many files, in parallel, into one output
# ------------------------------------------------------------------------------------------------


def _prepare_to_part(job: tuple) -> tuple[str, int, int]:
    """Worker: one input file to a temporary part file; returns (part path, documents, sentences)."""
    path, part, splitter, split_chapters, paragraph_mode, strip_boilerplate, encoding, decode_errors = job
    split = make_sentence_splitter(splitter)
    n_docs = n_sents = 0
    with open(part, "w", encoding="utf-8", newline="\n") as out:
        for doc in prepare_file(
            path, split, split_chapters, paragraph_mode, strip_boilerplate, encoding, decode_errors
        ):
            out.write("\n".join(doc))
            out.write("\n\n")
            n_docs += 1
            n_sents += len(doc)
    return part, n_docs, n_sents


@contextlib.contextmanager
def _open_output(path: str):
    with atomic_write(path, "wb") as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                yield gz
        else:
            yield raw


def prepare_corpus(
    files: list[str],
    output_file: str,
    sentence_splitter: str = "pysbd",
    split_chapters: bool = False,
    paragraph_mode: str = "auto",
    strip_boilerplate: bool = True,
    encoding: str = "utf-8",
    decode_errors: str = "strict",
    num_workers: int = 1,
    on_file_done: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Write the documents of `files`, in order, to `output_file` (atomically; .gz: gzipped).

    Each file is prepared into a temporary part beside the output (by `num_workers` processes), and the
    parts are appended in file order. Returns (documents, sentences).

    Raises:
        InputError: no sentence in any file, or a file that cannot be read or decoded.
    """
    n_docs = n_sents = 0
    out = Path(output_file).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Named after the output, so that the next run on it removes what a killed run left (bert.outputs).
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.tmp-", dir=out.parent) as tmp:
        jobs = [
            (f, os.path.join(tmp, f"part{i:06d}.txt"), sentence_splitter, split_chapters, paragraph_mode)
            + (strip_boilerplate, encoding, decode_errors)
            for i, f in enumerate(files)
        ]
        with _open_output(output_file) as out:
            if num_workers == 1:
                results: Iterable[tuple[str, int, int]] = map(_prepare_to_part, jobs)
                pool = None
            else:
                context = multiprocessing.get_context("spawn")
                pool = context.Pool(min(num_workers, len(files)), initializer=exit_with_parent, initargs=(os.getpid(),))
                results = pool.imap(_prepare_to_part, jobs)
            try:
                for part, d, s in results:
                    with open(part, "rb") as fp:
                        shutil.copyfileobj(fp, out)
                    os.unlink(part)
                    n_docs += d
                    n_sents += s
                    if on_file_done is not None:
                        on_file_done()
            finally:
                if pool is not None:
                    pool.terminate()
                    pool.join()
            if n_docs == 0:
                raise InputError(
                    f"no sentences found in {len(files)} file(s) ({files[0]}{', ...' if len(files) > 1 else ''}); "
                    "are they empty, or is everything inside the Project Gutenberg header/footer?"
                )
    return n_docs, n_sents
