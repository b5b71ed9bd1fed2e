"""`bert build-vocab`: learn a WordPiece vocab.txt from a corpus, for pre-training on one's own domain.

The library is `bert.vocab`; this module holds the flags, checks them before any work and writes the
files. Loads no torch.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bert import __version__
from bert.errors import InputError
from bert.flags import CorpusArgs, same_as
from bert.outputs import claim
from bert.utils import atomic_write, expand_input_files, print_result
from bert.vocab import UNUSED_BEFORE_UNK, build_vocab, vocab_layout

logger = logging.getLogger(__name__)


@dataclass
class BuildVocabArgs:
    """Learn a WordPiece vocabulary (vocab.txt) from text: the original's basic tokenization, then
    WordPiece training, in the released files' layout, for FullTokenizer and every command here."""

    input_file: str = field(
        metadata={
            "help": "Input text (or comma-separated list of files; glob patterns are expanded; .gz files are "
            "decompressed), e.g. the input of create-pretraining-data."
        }
    )
    output_file: str = field(
        metadata={"help": "Output vocab.txt, one token per line (id = line number); statistics go beside it."}
    )
    vocab_size: int = field(
        default=30522,
        metadata={
            "help": "Entries in all, special and unused tokens included (30522 is BERT uncased's); fewer if "
            "the corpus runs out of pairs to merge."
        },
    )
    num_unused: int = field(
        default=UNUSED_BEFORE_UNK,
        metadata={
            "help": "[unusedN] placeholders, to be replaced by domain words later without resizing the model. "
            "As in the released vocabs the first 99 lie between [PAD] and [UNK], so [PAD]=0, [UNK]=100, "
            "[CLS]=101, [SEP]=102, [MASK]=103 as in every BERT model; more follow [MASK] (994 gives the "
            "uncased vocab's first 999 ids exactly)."
        },
    )
    limit_alphabet: int = field(
        default=1000,
        metadata={
            "help": "Most distinct characters kept (the most frequent); a word with any other character "
            "becomes [UNK]. Each also gets a '##' piece unless it is punctuation or a CJK ideograph."
        },
    )
    min_frequency: int = field(
        default=2, metadata={"help": "Pairs of pieces occurring fewer times than this are never merged."}
    )
    do_lower_case: bool = field(
        default=True,
        metadata={
            "help": "Whether to lower case (and strip accents from) the input text. True for an uncased "
            "model, False for a cased one; pass the same value to every command using the vocab."
        },
    )
    heldout_file: str | None = field(
        default=None,
        metadata={
            "help": "Text not used for training (comma-separated globs) on which to report the share of "
            "[UNK] words and the pieces per word."
        },
    )
    decode_errors: str = same_as(CorpusArgs, "decode_errors")


def stats_path(output_file: str | os.PathLike) -> Path:
    """Where the statistics of a vocab go: `vocab.txt` -> `vocab.stats.json`."""
    return Path(output_file).with_suffix(".stats.json")


def _validate(args: BuildVocabArgs) -> tuple[list[str], list[str]]:
    """Check every flag before any work; returns (input files, held-out files)."""
    if args.num_unused < 0:
        raise InputError(f"--num_unused={args.num_unused} must be 0 or more")
    if args.limit_alphabet < 1:
        raise InputError(f"--limit_alphabet={args.limit_alphabet} must be at least 1 (BERT's vocabs keep 1000)")
    if args.min_frequency < 0:
        raise InputError(f"--min_frequency={args.min_frequency} must be 0 or more")
    reserved = len(vocab_layout(args.num_unused))
    if args.vocab_size <= reserved:
        raise InputError(
            f"--vocab_size={args.vocab_size} leaves no room for pieces after {reserved} special and unused "
            f"tokens; raise --vocab_size (BERT's is 30522) or lower --num_unused"
        )
    inputs = expand_input_files(args.input_file)
    heldout = expand_input_files(args.heldout_file, "--heldout_file") if args.heldout_file else []
    return inputs, heldout


def run_build_vocab(args: BuildVocabArgs) -> dict[str, Any]:
    """Write the vocab to `args.output_file` and its statistics beside it; returns the statistics."""
    inputs, heldout = _validate(args)
    outputs: list[str | Path] = [args.output_file, stats_path(args.output_file)]
    with claim(
        "build-vocab", files={"--output_file": outputs}, inputs={"--input_file": inputs, "--heldout_file": heldout}
    ):
        return _build(args, inputs, heldout)


def _build(args: BuildVocabArgs, inputs: list[str], heldout: list[str]) -> dict[str, Any]:
    start = time.time()
    tokens, stats = build_vocab(
        inputs,
        vocab_size=args.vocab_size,
        num_unused=args.num_unused,
        limit_alphabet=args.limit_alphabet,
        min_frequency=args.min_frequency,
        do_lower_case=args.do_lower_case,
        decode_errors=args.decode_errors,
        heldout_files=heldout,
    )
    stats["seconds"] = round(time.time() - start, 3)
    stats["input_files"] = len(inputs)
    with atomic_write(args.output_file) as f:
        f.write("".join(t + "\n" for t in tokens))
    record = {
        "command": "build-vocab",
        "args": asdict(args),
        "argv": sys.argv,
        "bert_version": __version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **stats,
    }
    with atomic_write(stats_path(args.output_file)) as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    _report(args.output_file, stats)
    return {"output_file": args.output_file, "stats_file": str(stats_path(args.output_file)), **stats}


def _report(output_file: str, stats: dict[str, Any]) -> None:
    """The log line and the result block of a written vocabulary: its size and coverage."""
    train = stats["train"]
    logger.info(
        "Wrote %s: %d entries (%d special and unused, %d characters, %d learned pieces) from %d words in %.1f s; "
        "training text: %.4f%% [UNK] words, %.3f pieces per word",
        output_file,
        stats["vocab_size"],
        stats["special_and_unused"],
        stats["alphabet_size"],
        stats["learned_pieces"],
        stats["words"],
        stats["seconds"],
        100 * train["unk_rate"],
        train["pieces_per_word"],
    )
    if stats["heldout"] is not None:
        logger.info(
            "Held-out text (%d words): %.4f%% [UNK] words, %.3f pieces per word",
            stats["heldout"]["words"],
            100 * stats["heldout"]["unk_rate"],
            stats["heldout"]["pieces_per_word"],
        )
    heldout_stats = stats["heldout"]
    print_result(
        "build-vocab",
        f"{stats['vocab_size']} entries ({stats['learned_pieces']} learned pieces) from {stats['words']} words",
        f"training text: {100 * train['unk_rate']:.4f}% [UNK] words, {train['pieces_per_word']:.3f} pieces per word",
        f"held-out text: {100 * heldout_stats['unk_rate']:.4f}% [UNK] words, "
        f"{heldout_stats['pieces_per_word']:.3f} pieces per word"
        if heldout_stats is not None
        else "",
        f"written to {output_file} (statistics: {stats_path(output_file)})",
        f"next: bert create-pretraining-data --vocab_file={output_file} ...",
    )
