"""`bert tokenize`: text or JSON lines -> WordPiece tokens and ids, one JSON line per input line.

Loads no torch: only the tokenizer and the text reader are imported.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from bert.errors import InputError
from bert.flags import CorpusArgs, ModelArgs, same_as
from bert.outputs import claim
from bert.tokenization import FullTokenizer, read_texts
from bert.utils import atomic_write, json_line, print_result


@dataclass
class TokenizeArgs:
    """Tokenize text with a WordPiece vocab: one input line (plain text, or a JSON object with a "text"
    field) -> one output JSON line {"text": ..., "tokens": [...], "ids": [...]}."""

    vocab_file: str = field(metadata={"help": "The vocabulary file that the BERT model was trained on."})
    do_lower_case: bool = same_as(ModelArgs, "do_lower_case")
    input_file: str | None = field(
        default=None,
        metadata={"help": "Input text file (one text per line, or JSON lines with a 'text' field); stdin if unset."},
    )
    output_file: str | None = field(default=None, metadata={"help": "Output JSON-lines file; stdout if unset."})
    decode_errors: str = same_as(CorpusArgs, "decode_errors")


_BATCH_LINES = 4096


def run_tokenize(args: TokenizeArgs) -> dict[str, Any]:
    """Tokenize every input line and write one JSON line per input line.

    Returns:
        {"lines": number of lines, "tokens": total number of word pieces, "output_file": path or None}.
    """
    with claim("tokenize", files={"--output_file": args.output_file}, inputs=_inputs(args)):
        result = _tokenize(args)
    if args.output_file is not None:  # on stdout the lines themselves are the result
        print_result(
            "tokenize", f"{result['lines']} lines, {result['tokens']} word pieces", f"written to {args.output_file}"
        )
    return result


def _inputs(args: TokenizeArgs) -> dict[str, str | None]:
    return {"--input_file": args.input_file, "--vocab_file": args.vocab_file}


def _tokenize(args: TokenizeArgs) -> dict[str, Any]:
    if not os.path.isfile(args.vocab_file):
        raise InputError(
            f"--vocab_file={args.vocab_file}: file not found; pass the vocab.txt of your model "
            f"(e.g. --vocab_file=uncased_L-12_H-768_A-12/vocab.txt)"
        )
    if args.input_file is not None and not os.path.isfile(args.input_file):
        raise InputError(
            f"--input_file={args.input_file}: file not found; pass an existing text file or omit it to read stdin"
        )
    tokenizer = FullTokenizer(args.vocab_file, do_lower_case=args.do_lower_case)
    n_lines = n_tokens = 0

    def convert(out, stream, name: str) -> None:
        nonlocal n_lines, n_tokens
        texts = read_texts(stream, name, args.decode_errors)
        while batch := list(itertools.islice(texts, _BATCH_LINES)):
            for text, tokens in zip(batch, tokenizer.tokenize_batch(batch)):
                record = {"text": text, "tokens": tokens, "ids": tokenizer.convert_tokens_to_ids(tokens)}
                out.write(json_line(record))
                out.write("\n")
                n_tokens += len(tokens)
            n_lines += len(batch)

    if args.input_file is None:
        stream_cm: Any = contextlib.nullcontext(sys.stdin.buffer)
        in_name = "<stdin>"
    else:
        stream_cm = open(args.input_file, "rb")
        in_name = args.input_file
    with stream_cm as stream:
        if args.output_file is None:
            sys.stdout.flush()
            if hasattr(sys.stdout, "buffer"):  # UTF-8 whatever the console's encoding, "\n" line ends
                out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
                try:
                    convert(out, stream, in_name)
                finally:
                    out.detach()  # flushes, and leaves sys.stdout open (also after an error)
            else:
                convert(sys.stdout, stream, in_name)
                sys.stdout.flush()
        else:
            with atomic_write(args.output_file) as f:
                convert(f, stream, in_name)
    return {"lines": n_lines, "tokens": n_tokens, "output_file": args.output_file}
