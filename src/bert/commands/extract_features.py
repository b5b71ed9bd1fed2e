"""`bert extract-features`: fixed contextual vectors per token as JSON lines (the original's extract_features.py).

See `bert.extract_features` for the output layout. With no flags but --output_file, it runs on the
built-in demo: five sentences and a tiny checkpoint written by the original TensorFlow code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from bert.config import resolve_config
from bert.errors import InputError
from bert.flags import CorpusArgs, ModelArgs, TpuCompatArgs, TrainingArgs, same_as
from bert.outputs import claim
from bert.tokenization import FullTokenizer, load_vocab
from bert.utils import atomic_write, log_to_file, print_result

logger = logging.getLogger(__name__)

_DEFAULT_LAYERS = "-1,-2,-3,-4"


@dataclass(kw_only=True)
class ExtractFeaturesArgs(ModelArgs):
    """Extract fixed features from a BERT checkpoint (extract_features.py).

    With no flags but --output_file, it runs on the built-in demo: five sentences and the tiny
    checkpoint written by the original TensorFlow code (random weights, 64 positions; a check that
    everything works).
    """

    output_file: str = field(metadata={"help": "Where to write the JSON lines."})
    input_file: str | None = field(
        default=None, metadata={"help": "One example per line; 'A ||| B' for a pair. Default: built-in demo text."}
    )
    layers: str = field(default=_DEFAULT_LAYERS, metadata={"help": "Encoder layers to output, e.g. -1,-2."})
    batch_size: int = field(default=32, metadata={"help": "Batch size for predictions."})
    use_tpu: bool = same_as(TpuCompatArgs, "use_tpu")
    use_one_hot_embeddings: bool = field(default=False, metadata={"help": "Accepted for compatibility; no effect."})
    device: str | None = same_as(TrainingArgs, "device")
    decode_errors: str = same_as(CorpusArgs, "decode_errors")


def run_extract_features(args: ExtractFeaturesArgs) -> dict:
    """Write the features of every input line; returns the number of examples and the output file."""
    inputs = {
        "--input_file": args.input_file,
        "--init_checkpoint": args.init_checkpoint,
        "--vocab_file": args.vocab_file,
        "--bert_config_file": args.bert_config_file,
    }
    derived = {"--output_file": [".args.json"]}
    with claim("extract-features", files={"--output_file": args.output_file}, inputs=inputs, derived=derived):
        return _extract_features(args)


def _extract_features(args: ExtractFeaturesArgs) -> dict:
    if args.use_tpu:
        raise InputError("--use_tpu=true is not supported; drop it (CPU and GPU are chosen with --device)")
    if args.batch_size < 1:
        raise InputError(f"--batch_size={args.batch_size} must be at least 1")
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.checkpoint import read_checkpoint
    from bert.extract_features import demo_file, parse_layers

    input_file = args.input_file or demo_file("input.txt")
    init_checkpoint = args.init_checkpoint or demo_file("bert_model.ckpt")
    if not Path(input_file).is_file():
        raise InputError(f"input file {input_file} does not exist; pass --input_file=PATH")
    ckpt = read_checkpoint(init_checkpoint)
    vocab_file = args.vocab_file or ckpt.vocab_file
    if vocab_file is None or not Path(vocab_file).is_file():
        raise InputError(f"vocab file {vocab_file or '(none beside the checkpoint)'} not found; pass --vocab_file=PATH")
    vocab_size = len(load_vocab(vocab_file))
    config = resolve_config(args.bert_config_file, vocab_size) if args.bert_config_file else ckpt.config
    if config is None:
        raise InputError(f"no config found beside {init_checkpoint}; pass --bert_config_file=PATH or a shape's name")
    config.validate_vocab(vocab_size, vocab_file)
    if args.init_checkpoint is None:
        # The built-in demo model has 2 layers and 64 positions; the defaults are the original's, for released
        # models, so the demo runs on its own with no flags but --output_file.
        fit: dict = {"max_seq_length": min(args.max_seq_length, config.max_position_embeddings)}
        if args.layers == _DEFAULT_LAYERS:
            fit["layers"] = ",".join(str(-i) for i in range(1, min(4, config.num_hidden_layers) + 1))
        args = dataclasses.replace(args, **fit)
    config.check_max_seq_length(args.max_seq_length, "--max_seq_length")
    layer_indexes = parse_layers(args.layers, config.num_hidden_layers)
    with log_to_file(f"{args.output_file}.log.txt"):
        return _extract(args, input_file, init_checkpoint, ckpt, config, vocab_file, layer_indexes)


def _extract(args: ExtractFeaturesArgs, input_file, init_checkpoint, ckpt, config, vocab_file, layer_indexes) -> dict:
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    import torch

    from bert.checkpoint import build_loaded, check_config_against_weights
    from bert.extract_features import convert_examples_to_features, extract, read_examples
    from bert.modeling import BertModel

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    check_config_against_weights(config, ckpt.state_dict, "the config", ckpt.source)
    model = build_loaded(BertModel, config, ckpt).to(device).eval()
    tokenizer = FullTokenizer(vocab_file, do_lower_case=args.do_lower_case)
    features = convert_examples_to_features(
        read_examples(input_file, args.decode_errors), args.max_seq_length, tokenizer
    )

    n = 0
    with atomic_write(args.output_file) as f:
        for obj in extract(model, features, layer_indexes, args.batch_size, device):
            f.write(json.dumps(obj) + "\n")
            n += 1
    with atomic_write(str(args.output_file) + ".args.json") as f:
        json.dump({"command": "extract-features", "args": vars(args), "examples": n}, f, indent=2)
    logger.info("wrote features of %d examples to %s", n, args.output_file)
    print_result(
        "extract-features",
        f"{n} examples, layers {','.join(map(str, layer_indexes))} of {init_checkpoint}",
        f"written to {args.output_file} (log: {args.output_file}.log.txt)",
    )
    return {"examples": n, "output_file": args.output_file}
