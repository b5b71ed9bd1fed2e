"""Fixed contextual vectors per token, like ELMo: the library of the original's extract_features.py.

The output objects are the original's JSON lines, key for key: `linex_index` (sic), then `features`,
one per real token ([CLS] and [SEP] included, padding not), each with `token` and `layers`, one per
requested layer, each with `index` and `values` rounded to 6 decimals. Layer -1 is the last encoder
block; the embedding output is not a layer, as in the original.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from bert.errors import InputError
from bert.tasks.common import truncate_seq_pair
from bert.utils import progress, undecodable

logger = logging.getLogger(__name__)

# The original splits on the last " ||| " (its first group is greedy).
_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


def demo_file(name: str) -> str:
    """A file of the built-in demo: `input.txt`, `bert_model.ckpt` (a tiny TF checkpoint), its config and vocab."""
    return str(resources.files("bert") / "data" / "demo" / name)


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


def read_examples(input_file: str | Path, errors: str = "strict") -> list[InputExample]:
    """One example per line, stripped; empty lines are examples too, as in the original.

    `errors`: what to do with bytes that are not UTF-8: "strict" (an `InputError` naming the line),
    "ignore" (drop them, as the original's `convert_to_unicode` does) or "replace".
    """
    try:
        with open(input_file, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InputError(f"input file {input_file} does not exist; pass --input_file=PATH") from None
    try:
        text = raw.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise undecodable(input_file, raw, e) from None
    lines = text.splitlines()
    examples = []
    for i, line in enumerate(lines):
        line = line.strip()
        m = _PAIR.match(line)
        examples.append(InputExample(i, m.group(1), m.group(2)) if m else InputExample(i, line, None))
    return examples


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
    for start in progress(range(0, len(features), batch_size), desc="extract-features", unit="batch"):
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
