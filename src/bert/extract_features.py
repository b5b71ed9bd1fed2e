"""`bert extract-features`: fixed contextual vectors per token, like ELMo (the original's extract_features.py).

The output is the original's JSON lines, key for key: `linex_index` (sic), then `features`, one per
real token ([CLS] and [SEP] included, padding not), each with `token` and `layers`, one per `--layers`
entry, each with `index` and `values` rounded to 6 decimals. Layer -1 is the last encoder block; the
embedding output is not a layer, as in the original.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch
from tqdm import tqdm

from bert.errors import InputError

logger = logging.getLogger(__name__)

# The original splits on the last " ||| " (its first group is greedy).
_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


def _demo(name: str) -> str:
    return str(resources.files("bert") / "data" / "demo" / name)


@dataclass
class ExtractFeaturesArgs:
    """Extract fixed features from a BERT checkpoint (extract_features.py).

    With no flags but --output_file, it runs on the built-in demo: five sentences and the tiny
    checkpoint written by the original TensorFlow code (random weights; a check that everything works).
    """

    output_file: str = field(metadata={"help": "Where to write the JSON lines."})
    input_file: str | None = field(
        default=None, metadata={"help": "One example per line; 'A ||| B' for a pair. Default: built-in demo text."}
    )
    layers: str = field(default="-1,-2,-3,-4", metadata={"help": "Encoder layers to output, e.g. -1,-2."})
    bert_config_file: str | None = field(
        default=None, metadata={"help": "Config of the pre-trained model (found beside the checkpoint if absent)."}
    )
    max_seq_length: int = field(
        default=128, metadata={"help": "Maximum total length after WordPiece; longer inputs are truncated."}
    )
    init_checkpoint: str | None = field(
        default=None, metadata={"help": "Checkpoint in any supported format. Default: the built-in tiny model."}
    )
    vocab_file: str | None = field(
        default=None, metadata={"help": "vocab.txt of the model (found beside the checkpoint if absent)."}
    )
    do_lower_case: bool = field(default=True, metadata={"help": "Lower-case the input (True for uncased models)."})
    batch_size: int = field(default=32, metadata={"help": "Batch size for predictions."})
    use_tpu: bool = field(default=False, metadata={"help": "Accepted for compatibility; must stay false."})
    use_one_hot_embeddings: bool = field(default=False, metadata={"help": "Accepted for compatibility; no effect."})
    device: str | None = field(default=None, metadata={"help": "torch device; default cuda if available, else cpu."})


@dataclass
class InputExample:
    unique_id: int
    text_a: str
    text_b: str | None


@dataclass
class InputFeatures:
    unique_id: int
    tokens: list[str]
    input_ids: list[int]
    input_mask: list[int]
    input_type_ids: list[int]


def read_examples(input_file: str | Path) -> list[InputExample]:
    """One example per line, stripped; empty lines are examples too, as in the original."""
    try:
        with open(input_file, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InputError(f"input file {input_file} does not exist; pass --input_file=PATH") from None
    # The original decodes with errors ignored (convert_to_unicode).
    lines = raw.decode("utf-8", errors="ignore").splitlines()
    examples = []
    for i, line in enumerate(lines):
        line = line.strip()
        m = _PAIR.match(line)
        examples.append(InputExample(i, m.group(1), m.group(2)) if m else InputExample(i, line, None))
    return examples


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Pop from the end of the longer sequence until the pair fits (the original's rule)."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def convert_examples_to_features(examples: list[InputExample], max_seq_length: int, tokenizer) -> list[InputFeatures]:
    """[CLS] A [SEP] (B [SEP]) with segment ids 0/1, truncated to max_seq_length; padding is left to batching."""
    features = []
    for ex in examples:
        tokens_a = tokenizer.tokenize(ex.text_a)
        tokens_b = tokenizer.tokenize(ex.text_b) if ex.text_b is not None else None
        if tokens_b is not None:
            truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)  # [CLS], [SEP], [SEP]
        else:
            tokens_a = tokens_a[: max_seq_length - 2]  # [CLS], [SEP]
        tokens = ["[CLS]", *tokens_a, "[SEP]"]
        type_ids = [0] * len(tokens)
        if tokens_b is not None:
            tokens += [*tokens_b, "[SEP]"]
            type_ids += [1] * (len(tokens_b) + 1)
        ids = tokenizer.convert_tokens_to_ids(tokens)
        features.append(InputFeatures(ex.unique_id, tokens, ids, [1] * len(ids), type_ids))
        if ex.unique_id < 5:
            logger.info("*** Example *** unique_id: %s tokens: %s", ex.unique_id, " ".join(tokens))
    return features


def parse_layers(layers: str, num_hidden_layers: int) -> list[int]:
    try:
        indexes = [int(x) for x in layers.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--layers={layers} must be comma-separated integers such as -1,-2,-3,-4") from None
    if not indexes:
        raise InputError("--layers is empty; give at least one layer, e.g. --layers=-1")
    for i in indexes:
        if not -num_hidden_layers <= i < num_hidden_layers:
            raise InputError(
                f"--layers={layers}: layer {i} does not exist in a {num_hidden_layers}-layer model; "
                f"use values from {-num_hidden_layers} to {num_hidden_layers - 1}"
            )
    return indexes


@torch.no_grad()
def extract(model, features: list[InputFeatures], layer_indexes: list[int], batch_size: int, device) -> Iterator[dict]:
    """Yield the original's JSON object for each feature, in input order.

    Batches are padded to their own longest sequence, not to max_seq_length: padded keys get -10000
    before the softmax, so real tokens' outputs are the same (within float rounding) and much cheaper.
    """
    for start in tqdm(range(0, len(features), batch_size), desc="extract-features", unit="batch"):
        batch = features[start : start + batch_size]
        T = max(len(f.input_ids) for f in batch)

        def pad(rows):
            return torch.tensor([r + [0] * (T - len(r)) for r in rows], dtype=torch.long, device=device)  # [B, T]

        ids, mask, types = (pad([getattr(f, k) for f in batch]) for k in ("input_ids", "input_mask", "input_type_ids"))
        out = model(ids, mask, types)
        layers = [out.all_encoder_layers[i].float().cpu() for i in layer_indexes]  # each [B, T, H]
        for b, f in enumerate(batch):
            feats = []
            for t, token in enumerate(f.tokens):
                per_layer = [
                    OrderedDict(index=idx, values=[round(x, 6) for x in layer[b, t].tolist()])
                    for idx, layer in zip(layer_indexes, layers)
                ]
                feats.append(OrderedDict(token=token, layers=per_layer))
            yield OrderedDict(linex_index=f.unique_id, features=feats)


def run_extract_features(args: ExtractFeaturesArgs) -> dict:
    from bert.checkpoint import load_pretrained, read_checkpoint
    from bert.config import BertConfig
    from bert.modeling import BertModel
    from bert.tokenization import FullTokenizer, load_vocab
    from bert.utils import atomic_write

    if args.use_tpu:
        raise InputError("--use_tpu=true is not supported; drop it (CPU and GPU are chosen with --device)")
    if args.batch_size < 1:
        raise InputError(f"--batch_size={args.batch_size} must be at least 1")
    input_file = args.input_file or _demo("input.txt")
    init_checkpoint = args.init_checkpoint or _demo("bert_model.ckpt")
    if not Path(input_file).is_file():
        raise InputError(f"input file {input_file} does not exist; pass --input_file=PATH")
    ckpt = read_checkpoint(init_checkpoint, config_file=args.bert_config_file)
    config: BertConfig | None = ckpt.config
    if config is None:
        raise InputError(f"no config found beside {init_checkpoint}; pass --bert_config_file=PATH")
    vocab_file = args.vocab_file or ckpt.vocab_file
    if vocab_file is None or not Path(vocab_file).is_file():
        raise InputError(f"vocab file {vocab_file or '(none beside the checkpoint)'} not found; pass --vocab_file=PATH")
    config.validate_vocab(len(load_vocab(vocab_file)), vocab_file)
    if args.max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"--max_seq_length={args.max_seq_length} exceeds the model's max_position_embeddings="
            f"{config.max_position_embeddings}; lower it"
        )
    if args.max_seq_length < 3:
        raise InputError(f"--max_seq_length={args.max_seq_length} leaves no room for [CLS] and [SEP]; use at least 3")
    layer_indexes = parse_layers(args.layers, config.num_hidden_layers)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_pretrained(BertModel, init_checkpoint, config=config, checkpoint=ckpt).to(device).eval()
    tokenizer = FullTokenizer(vocab_file, do_lower_case=args.do_lower_case)
    features = convert_examples_to_features(read_examples(input_file), args.max_seq_length, tokenizer)

    n = 0
    with atomic_write(args.output_file) as f:
        for obj in extract(model, features, layer_indexes, args.batch_size, device):
            f.write(json.dumps(obj) + "\n")
            n += 1
    with atomic_write(str(args.output_file) + ".args.json") as f:
        json.dump({"command": "extract-features", "args": vars(args), "examples": n}, f, indent=2)
    logger.info("wrote features of %d examples to %s", n, args.output_file)
    return {"examples": n, "output_file": args.output_file}
