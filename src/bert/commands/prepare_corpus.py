"""`bert prepare-corpus`: raw books (plain or .gz) -> one sentence per line, a blank line between documents.

The library is `bert.pretraining.corpus`; this module holds the flags and checks them.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from bert.flags import CorpusArgs, check_flag_values
from bert.outputs import claim
from bert.pretraining.corpus import PARAGRAPH_MODES, SENTENCE_SPLITTERS, make_sentence_splitter, prepare_corpus
from bert.utils import expand_input_files, log_to_file, print_result, progress

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class PrepareCorpusArgs(CorpusArgs):
    """Raw text (e.g. Project Gutenberg books, plain or .gz) to one sentence per line, blank line between documents."""

    input_file: str = field(
        metadata={"help": "Input raw text file(s): comma-separated glob patterns; .gz files are decompressed."}
    )
    output_file: str = field(
        metadata={"help": "Output text file: one sentence per line, a blank line between documents (.gz: gzipped)."}
    )
    sentence_splitter: str = field(
        default="pysbd",
        metadata={
            "help": "Sentence splitter: pysbd (rule based, handles abbreviations and quotes) or blingfire "
            "(about 40x faster, splits after 'Mr.').",
            "choices": SENTENCE_SPLITTERS,
        },
    )
    split_chapters: bool = field(
        default=False,
        metadata={"help": "Start a new document at each chapter heading (e.g. 'CHAPTER IV.'), dropping the heading."},
    )
    paragraph_mode: str = field(
        default="auto",
        metadata={
            "help": "blank_line: paragraphs are separated by blank lines and wrapped lines are joined; "
            "line: each line is a paragraph; auto: decide per file from its line lengths.",
            "choices": PARAGRAPH_MODES,
        },
    )
    strip_gutenberg: bool = field(
        default=True, metadata={"help": "Drop the Project Gutenberg header and footer (START/END OF lines)."}
    )
    encoding: str = field(default="utf-8", metadata={"help": "Text encoding of the input files."})


def run_prepare_corpus(args: PrepareCorpusArgs) -> dict:
    """Write `args.output_file` from `args.input_file`; returns counts of files, documents, sentences."""
    check_flag_values(args)
    files = expand_input_files(args.input_file)
    with claim("prepare-corpus", files={"--output_file": args.output_file}, inputs={"--input_file": files}):
        result = _prepare_corpus(args, files)
    print_result(
        "prepare-corpus",
        f"{result['files']} files -> {result['documents']} documents, {result['sentences']} sentences",
        f"written to {args.output_file} (log: {args.output_file}.log.txt)",
        f"next: bert create-pretraining-data --input_file={args.output_file} --vocab_file=VOCAB.txt ...",
    )
    return result


def _prepare_corpus(args: PrepareCorpusArgs, files: list[str]) -> dict:
    make_sentence_splitter(args.sentence_splitter)  # fail early when the package is missing
    with log_to_file(f"{args.output_file}.log.txt"):
        start = time.time()
        in_bytes = sum(os.path.getsize(f) for f in files)
        with progress(total=len(files), unit="file", desc="prepare-corpus") as bar:
            n_docs, n_sents = prepare_corpus(
                files,
                args.output_file,
                args.sentence_splitter,
                args.split_chapters,
                args.paragraph_mode,
                args.strip_gutenberg,
                args.encoding,
                args.decode_errors,
                args.num_workers,
                on_file_done=lambda: bar.update(1),
            )
        seconds = time.time() - start
        logger.info(
            "Wrote %d documents, %d sentences from %d files to %s in %.1f s",
            n_docs,
            n_sents,
            len(files),
            args.output_file,
            seconds,
        )
    return {
        "files": len(files),
        "documents": n_docs,
        "sentences": n_sents,
        "input_bytes": in_bytes,
        "seconds": round(seconds, 3),
    }
