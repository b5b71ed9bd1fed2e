"""`bert convert`: a checkpoint from one format (TF, transformers, native; detected) into another.

The model keeps its architecture: a head-less `BertModel` (a sentence-transformers model such as
all-MiniLM-L6-v2) stays one, and a fine-tuned model keeps its head. `--model_class` picks another; one
with weights the input lacks (the pre-training heads of a `BertModel`) is refused unless `--add_heads`,
which then says on the terminal which weights are random. A sentence-transformers directory's own files
(`modules.json`, `sentence_bert_config.json`, `config_sentence_transformers.json`, the module folders
such as `1_Pooling/`) are copied into every format, so `bert embed` pools, normalises and truncates the
converted model as it did the input.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bert.errors import InputError
from bert.flags import ModelArgs, same_as
from bert.outputs import claim, staged_directory
from bert.utils import load_json_file, log_to_file, print_result, write_run_info

logger = logging.getLogger(__name__)

SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
# What each architecture is used with next, for the result block.
NEXT_COMMAND = {
    "BertModel": "bert embed",
    "BertForPreTraining": "bert fill-mask",
    "BertForMaskedLM": "bert fill-mask",
}


@dataclass
class ConvertArgs:
    """Convert a checkpoint (TF, transformers or native; detected) into another format."""

    input: str = field(
        metadata={"model": True, "help": "Checkpoint to read: a directory, a TF prefix, or a weights file."}
    )
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
    model_class: str | None = field(
        default=None,
        metadata={
            "help": "Which model to write (decides the heads that are kept). Default: the input's own architecture "
            "(config.json's architectures, else the heads its weights hold), or BertForPreTraining with --add_heads."
        },
    )
    add_heads: bool = field(
        default=False,
        metadata={
            "help": "Allow a --model_class with heads the input lacks (default BertForPreTraining): they are "
            "randomly initialised, and the terminal lists them."
        },
    )


def run_convert(args: ConvertArgs) -> dict:
    """Read `--input` in any format and write it as `--format`; returns the output path, architecture, tensor
    count, the randomly initialised weights and the sentence-transformers files carried.

    The files appear in `--output` only once all of them are written (see `bert.outputs.staged_directory`).
    """
    inputs = {"--input": args.input, "--bert_config_file": args.bert_config_file, "--vocab_file": args.vocab_file}
    # Files of --output are replaced by name: a directory holding the input would lose it half-way.
    with claim("convert", dirs={"--output": args.output}, inputs=inputs, inputs_inside=False):
        result = _convert(args)
    random = f"; {len(result['random'])} randomly initialised weights (--add_heads)" if result["random"] else ""
    carried = ", ".join(result["sentence_transformers"])
    command = NEXT_COMMAND.get(result["architecture"], "bert predict")
    print_result(
        "convert",
        f"{result['architecture']}, {result['num_tensors']} tensors{random}",
        f"written as {args.format} to {result['output']}",
        f"sentence-transformers files carried: {carried}" if carried else "",
        f"next: {command} --model={result['output']}",
    )
    return result


def sentence_transformers_files(model_dir: Path) -> list[Path]:
    """The files and module folders a sentence-transformers directory adds to the transformer's own."""
    if not (model_dir / "modules.json").is_file():
        return []
    modules = load_json_file(model_dir / "modules.json", "sentence-transformers modules file")
    folders = {str(m.get("path", "")) for m in modules if isinstance(m, dict)} - {""}
    found = [model_dir / name for name in SENTENCE_TRANSFORMERS_FILES if (model_dir / name).is_file()]
    return found + [model_dir / f for f in sorted(folders) if (model_dir / f).is_dir()]


def _check_random(random: list[str], args: ConvertArgs, own: str, model_class: str) -> None:
    """Weights the output's architecture adds to the input's (randomly initialised): refused without
    --add_heads, warned of with it."""
    if random and not args.add_heads:
        raise InputError(
            f"--input={args.input} is a {own}; a {model_class} would add {len(random)} randomly initialised "
            f"weights (e.g. {random[0]}); pass --add_heads to write them anyway, or leave --model_class out to "
            "keep the input's architecture"
        )
    if random:
        logger.warning(
            "--add_heads: %d weights of %s are randomly initialised, not trained (%s): its outputs are "
            "meaningless until it is trained",
            len(random),
            model_class,
            ", ".join(sorted({k.rsplit(".", 2)[0] for k in random})),
        )


def _convert(args: ConvertArgs) -> dict:
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert import checkpoint
    from bert.config import resolve_config
    from bert.modeling import MODEL_CLASSES
    from bert.tokenization import load_vocab

    if args.model_class is not None and args.model_class not in MODEL_CLASSES:
        raise InputError(f"--model_class={args.model_class} is unknown; use one of {', '.join(MODEL_CLASSES)}")
    src = checkpoint.read_checkpoint(args.input)
    vocab_file = args.vocab_file or src.vocab_file
    config = src.config
    if args.bert_config_file:
        # A shape's name takes vocab_size from the vocabulary, else from the checkpoint's embeddings.
        embeddings = [v for k, v in src.state_dict.items() if k.endswith("word_embeddings.weight")]
        vocab_size = len(load_vocab(vocab_file)) if vocab_file else embeddings[0].shape[0] if embeddings else None
        config = resolve_config(args.bert_config_file, vocab_size)
    own = checkpoint.architecture(src, MODEL_CLASSES, "bert convert converts")
    model_class = args.model_class or ("BertForPreTraining" if args.add_heads else own)
    do_lower_case = (
        args.do_lower_case if args.do_lower_case is not None else src.tokenizer_settings.get("do_lower_case")
    )
    base = Path(args.input) if Path(args.input).is_dir() else Path(args.input).parent
    carried = sentence_transformers_files(base)
    out = Path(args.output)
    # The log goes into the staged directory too: nothing appears in --output before the whole of it.
    with staged_directory(out) as tmp, log_to_file(tmp / "log.txt"):
        # A BertModel saved without its pooler (transformers' add_pooling_layer=False) stays without one.
        pooler = any(k.endswith("pooler.dense.weight") for k in src.state_dict)
        kwargs = {"add_pooling_layer": False} if model_class == "BertModel" and not pooler else {}
        model = checkpoint.load_pretrained(
            MODEL_CLASSES[model_class], args.input, config=config, checkpoint=src, **kwargs
        )
        held = set(checkpoint._fit_prefix(src.state_dict, model))
        random = sorted(k for k in model.state_dict() if k not in held and not k.endswith(checkpoint.TIED_KEY))
        _check_random(random, args, own, model_class)
        if args.format == "tf":
            checkpoint.export_tf(model, tmp, vocab_file=vocab_file, do_lower_case=do_lower_case)
        else:
            checkpoint.save_pretrained(
                model, tmp, vocab_file=vocab_file, do_lower_case=do_lower_case, hf_layout=args.format == "hf"
            )
        for path in carried:
            if path.is_dir():
                shutil.copytree(path, tmp / path.name)
            else:
                shutil.copyfile(path, tmp / path.name)
        write_run_info(tmp, "convert", args)
        logger.info("wrote %s checkpoint of %s to %s", args.format, model_class, out)
    return {
        "output": str(out),
        "format": args.format,
        "architecture": model_class,
        "num_tensors": len(model.state_dict()),
        "random": random,
        "sentence_transformers": [p.name for p in carried],
    }
