"""`bert convert`: a checkpoint from one format (TF, transformers, native; detected) into another."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from bert import checkpoint
from bert.config import resolve_config
from bert.errors import InputError
from bert.flags import ModelArgs, same_as
from bert.modeling import MODEL_CLASSES
from bert.outputs import claim, staged_directory
from bert.tokenization import load_vocab
from bert.utils import log_to_file, write_run_info

logger = logging.getLogger(__name__)


@dataclass
class ConvertArgs:
    """Convert a checkpoint (TF, transformers or native; detected) into another format."""

    input: str = field(metadata={"help": "Checkpoint to read: a directory, a TF prefix, or a weights file."})
    output: str = field(metadata={"help": "Directory to write the converted checkpoint into."})
    format: str = field(
        default="native",
        metadata={"help": "Output format.", "choices": ["native", "hf", "tf"]},
    )
    bert_config_file: str | None = same_as(ModelArgs, "bert_config_file")
    vocab_file: str | None = same_as(ModelArgs, "vocab_file")
    do_lower_case: bool | None = field(
        default=None, metadata={"help": "Tokenizer casing to record (read from the input's settings if absent)."}
    )
    model_class: str = field(
        default="BertForPreTraining",
        metadata={"help": "Which model the weights belong to (decides the heads that are kept)."},
    )


def run_convert(args: ConvertArgs) -> dict:
    """Read `--input` in any format and write it as `--format`; returns the output path and tensor count.

    The files appear in `--output` only once all of them are written (see `bert.outputs.staged_directory`).
    """
    inputs = {"--input": args.input, "--bert_config_file": args.bert_config_file, "--vocab_file": args.vocab_file}
    # Files of --output are replaced by name: a directory holding the input would lose it half-way.
    with claim("convert", dirs={"--output": args.output}, inputs=inputs, inputs_inside=False):
        return _convert(args)


def _convert(args: ConvertArgs) -> dict:
    if args.model_class not in MODEL_CLASSES:
        raise InputError(f"--model_class={args.model_class} is unknown; use one of {', '.join(MODEL_CLASSES)}")
    src = checkpoint.read_checkpoint(args.input)
    vocab_file = args.vocab_file or src.vocab_file
    config = src.config
    if args.bert_config_file:
        # A shape's name takes vocab_size from the vocabulary, else from the checkpoint's embeddings.
        embeddings = [v for k, v in src.state_dict.items() if k.endswith("word_embeddings.weight")]
        vocab_size = len(load_vocab(vocab_file)) if vocab_file else embeddings[0].shape[0] if embeddings else None
        config = resolve_config(args.bert_config_file, vocab_size)
    do_lower_case = (
        args.do_lower_case if args.do_lower_case is not None else src.tokenizer_settings.get("do_lower_case")
    )
    out = Path(args.output)
    # The log goes into the staged directory too: nothing appears in --output before the whole of it.
    with staged_directory(out) as tmp, log_to_file(tmp / "log.txt"):
        model = checkpoint.load_pretrained(MODEL_CLASSES[args.model_class], args.input, config=config, checkpoint=src)
        if args.format == "tf":
            checkpoint.export_tf(model, tmp, vocab_file=vocab_file, do_lower_case=do_lower_case)
        else:
            checkpoint.save_pretrained(
                model, tmp, vocab_file=vocab_file, do_lower_case=do_lower_case, hf_layout=args.format == "hf"
            )
        write_run_info(tmp, "convert", args)
        logger.info("wrote %s checkpoint of %s to %s", args.format, args.model_class, out)
    return {"output": str(out), "format": args.format, "num_tensors": len(model.state_dict())}
