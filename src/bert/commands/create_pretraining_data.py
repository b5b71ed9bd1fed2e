"""`bert create-pretraining-data`: text documents -> masked-LM and next-sentence instances (create_pretraining_data.py).

With one worker, the original's algorithm record for record; with `--streaming`, `--num_workers=N` or
`--num_shards=N`, the bounded-memory generator (`--num_shards/--shard_index` split it over
machines). Output: the original's TFRecord files, or a native dataset directory. The
library is `bert.pretraining` (`instances`, `streaming`, `create`); this module holds the flags and
checks them before any work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bert.errors import InputError
from bert.flags import CorpusArgs, MaskingArgs, ModelArgs, ShardArgs, check_flag_values, same_as
from bert.formats.native import check_output_dir
from bert.outputs import claim
from bert.pretraining.create import create_pretraining_data
from bert.pretraining.instances import SPECIAL_TOKENS
from bert.pretraining.streaming import GenerationSettings
from bert.tokenization import FullTokenizer
from bert.utils import expand_input_files, log_to_file, print_result


@dataclass(kw_only=True)
class CreatePretrainingDataArgs(MaskingArgs, CorpusArgs, ShardArgs):
    """Create masked LM / next sentence masked_lm examples for BERT (create_pretraining_data.py): TFRecord
    files as the original writes, or a native dataset of memory-mappable shards.

    --num_shards=N implies --streaming: every shard reads the whole corpus and generates its share of the
    buffers, so the N outputs hold exactly the instances of one run; `bert pretrain` takes the N native
    directories (a list or a glob) as one dataset, in one run's order."""

    input_file: str = field(
        metadata={"help": "Input raw text file (or comma-separated list of files); glob patterns are expanded."}
    )
    output_file: str = field(
        metadata={
            "help": "Output TF example file (or comma-separated list of files), or a directory for the native format."
        }
    )
    vocab_file: str = field(metadata={"help": "The vocabulary file that the BERT model was trained on."})
    do_lower_case: bool = same_as(ModelArgs, "do_lower_case")
    max_seq_length: int = same_as(ModelArgs, "max_seq_length")
    random_seed: int = field(default=12345, metadata={"help": "Random seed for data generation."})
    dupe_factor: int = field(
        default=10, metadata={"min": 1, "help": "Number of times to duplicate the input data (with different masks)."}
    )
    masked_lm_prob: float = field(default=0.15, metadata={"help": "Masked LM probability."})
    short_seq_prob: float = field(
        default=0.1,
        metadata={"help": "Probability of creating sequences which are shorter than the maximum length."},
    )
    output_format: str = field(
        default="auto",
        metadata={
            "help": "tfrecord (the original's), native (a directory of memory-mappable .npy shards + "
            "manifest.json), or auto: tfrecord when --output_file names contain 'tfrec'/'tf_record' or "
            "there are several of them, else native.",
            "choices": ("auto", "tfrecord", "native"),
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Bounded-memory generator over buffers of documents (any corpus size; not the "
            "original's random order). Off with one worker: the original algorithm, record for record."
        },
    )
    streaming_buffer_mb: float = field(
        default=4.0,
        metadata={"help": "Streaming: MB of text per buffer; random-next segments are drawn within a buffer."},
    )


def resolve_output_format(output_file: str, output_format: str) -> str:
    if output_format != "auto":
        return output_format
    outputs = [o for o in output_file.split(",") if o.strip()]
    if len(outputs) > 1 or all(("tfrec" in o.lower() or "tf_record" in o.lower()) for o in outputs):
        return "tfrecord"
    return "native"


def _validate(args: CreatePretrainingDataArgs) -> tuple[list[str], list[str], str, Any]:
    """Check every flag before any work; returns (input files, output files, format, tokenizer)."""
    check_flag_values(args)
    if args.max_seq_length < 5:
        raise InputError(
            f"--max_seq_length={args.max_seq_length} is too small: an instance needs [CLS] A [SEP] B [SEP] "
            "with at least 2 text tokens; use 5 or more (the original default is 128)"
        )
    for name in ("masked_lm_prob", "short_seq_prob"):
        value = getattr(args, name)
        if not 0.0 <= value <= 1.0:
            raise InputError(f"--{name}={value} is a probability; give a value between 0 and 1")
    args.check_shard_flags()
    if args.streaming_buffer_mb <= 0:
        raise InputError(f"--streaming_buffer_mb={args.streaming_buffer_mb} must be positive")
    outputs = [o.strip() for o in args.output_file.split(",") if o.strip()]
    if not outputs:
        raise InputError("--output_file is empty; give an output file (or a directory for the native format)")
    fmt = resolve_output_format(args.output_file, args.output_format)
    if fmt == "native":
        if len(outputs) != 1:
            raise InputError(
                f"--output_file has {len(outputs)} entries, but a native dataset is one directory; "
                "give one path or pass --output_format=tfrecord"
            )
        check_output_dir(Path(outputs[0]))
    else:
        for o in outputs:
            if os.path.isdir(o):
                raise InputError(f"--output_file={o} is a directory; a TFRecord output is a file")
    streaming = args.streaming or args.num_workers > 1 or args.num_shards > 1
    # Streaming bounds the tokenizer's memo too (compat holds the whole corpus anyway).
    if streaming:
        tokenizer = FullTokenizer(args.vocab_file, args.do_lower_case, cache_size=1 << 16)
    else:
        tokenizer = FullTokenizer(args.vocab_file, args.do_lower_case)
    missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.vocab]
    if missing:
        raise InputError(
            f"--vocab_file={args.vocab_file} has no {', '.join(missing)}; pre-training needs [CLS], [SEP] "
            "and [MASK] in the vocabulary (use a BERT vocab.txt)"
        )
    inputs = expand_input_files(args.input_file)
    return inputs, outputs, fmt, tokenizer


def run_create_pretraining_data(args: CreatePretrainingDataArgs) -> dict[str, Any]:
    """Run the command: compat or streaming generator, TFRecord or native output. Returns the statistics.

    The log (the original's, with its first instances) goes to `<first output>.log.txt`, beside the
    output, since the output itself appears only when it is complete.
    """
    inputs, outputs, fmt, tokenizer = _validate(args)
    read = {"--input_file": inputs, "--vocab_file": args.vocab_file}
    if fmt == "native":  # one directory, replaced whole
        claimed = claim("create-pretraining-data", trees={"--output_file": outputs[0]}, inputs=read)
    else:
        derived = {"--output_file": [".stats.json"]}
        claimed = claim("create-pretraining-data", files={"--output_file": outputs}, inputs=read, derived=derived)
    with claimed, log_to_file(f"{Path(outputs[0])}.log.txt"):
        stats = _create(args, inputs, outputs, fmt, tokenizer)
    print_result(
        "create-pretraining-data",
        f"{stats['documents']} documents, {stats['text_tokens']} tokens -> {stats['instances']} instances "
        f"({stats['mean_tokens_per_instance']:.1f} tokens each), {stats['predictions']} masked-LM predictions",
        f"written as {fmt} to {', '.join(outputs)} (log: {outputs[0]}.log.txt)",
        f"next: bert pretrain --input_file={args.output_file} --vocab_file={args.vocab_file} ...",
    )
    return stats


def _create(args: CreatePretrainingDataArgs, inputs: list[str], outputs: list[str], fmt: str, tokenizer: Any) -> dict:
    settings = GenerationSettings(
        vocab_file=args.vocab_file,
        do_lower_case=args.do_lower_case,
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor,
        do_whole_word_mask=args.do_whole_word_mask,
        random_seed=args.random_seed,
    )
    return create_pretraining_data(
        inputs,
        outputs,
        fmt,
        tokenizer,
        settings,
        streaming=args.streaming,
        num_workers=args.num_workers,
        buffer_mb=args.streaming_buffer_mb,
        decode_errors=args.decode_errors,
        run_args=args,
        shard=(args.shard_index, args.num_shards),
    )
