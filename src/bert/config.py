"""`BertConfig`: the model architecture, nothing about the job.

One file serves three code bases. `to_json_string()` writes the original 11 keys (what
google-research/bert's `BertConfig.from_json_file` reads; it copies any extra key onto the object and
ignores it) plus the keys transformers needs (`model_type`, `architectures`, `layer_norm_eps`,
`pad_token_id`), so the original code, `transformers.BertConfig.from_pretrained` and this project
all load it.

The one key whose meaning differs between them is `hidden_act`: in the original at its last commit
"gelu" is the tanh approximation, in transformers (and here) "gelu" is the exact erf form and
"gelu_new" the tanh form. A file without `model_type` is an original `bert_config.json`, so its
"gelu" is read as "gelu_new" (pass `original_gelu="erf"` for checkpoints trained before 2019-02-07,
when the original used erf). Files written here carry `model_type`, so their `hidden_act` is
always read with transformers' meaning; `to_original_json_string()` writes the original's spelling
for a TF export.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from bert.errors import InputError
from bert.utils import atomic_write, load_json_file


def _is_number(value: Any) -> bool:
    """A finite int or float, not a bool (JSON's true would pass as 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# The shortest sequence a model runs on: [CLS], one token and [SEP].
MIN_SEQ_LENGTH = 3

# transformers' `config.problem_type` values, which pick a sequence classifier's loss.
PROBLEM_TYPES = ("single_label_classification", "regression", "multi_label_classification")

# The settings a fine-tuning run records in config.json for inference (`bert.inference.Predictor` reads them;
# `tasks/*.py` `inference_config` writes them), with their types: checked when the file is read.
TASK_SETTINGS: dict[str, type] = {
    "max_seq_length": int,
    "doc_stride": int,
    "n_best_size": int,
    "max_answer_length": int,
    "max_query_length": int,
    "version_2_with_negative": bool,
    "null_score_diff_threshold": float,
    "problem_type": str,
    "label_thresholds": dict,
    "id2label": dict,
    "architectures": list,
}
# Of those, the ones transformers writes as null when unset.
_NULLABLE = ("problem_type",)


def check_setting(settings: dict[str, Any], key: str, kind: type, where: Any, null: bool = False) -> None:
    """`settings[key]`, when present, must be a `kind` (int: a positive integer; float: a finite number; null
    only with `null`); `where` names the file in the one-line error."""
    if key not in settings or (null and settings[key] is None):
        return
    value = settings[key]
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        want = "a positive integer"
    elif kind is float:
        ok, want = _is_number(value), "a finite number"
    else:
        ok, want = (
            isinstance(value, kind),
            {str: "a string", bool: "true or false"}.get(kind, f"a JSON {kind.__name__}"),
        )
    if not ok:
        raise InputError(f"{where}: {key} must be {want}, got {value!r}; fix or remove it")


def check_task_settings(settings: dict[str, Any], where: str) -> None:
    """The one check of the settings a fine-tuned model records (`TASK_SETTINGS`, `problem_type`'s values,
    `label_thresholds`): of every config file read (`BertConfig.from_dict`), and by `inference.Predictor` of a
    model whose config was built in Python. `where` names the file in the one-line error."""
    for key, kind in TASK_SETTINGS.items():
        check_setting(settings, key, kind, where, null=key in _NULLABLE)
    if settings.get("problem_type") not in (None, *PROBLEM_TYPES):
        raise InputError(f"{where}: problem_type {settings['problem_type']!r} is not one of {', '.join(PROBLEM_TYPES)}")
    for label, threshold in (settings.get("label_thresholds") or {}).items():
        if not _is_number(threshold) or not 0.0 <= threshold <= 1.0:
            raise InputError(f"{where}: label_thresholds[{label!r}] must be a number in [0, 1], got {threshold!r}")


# Activations the model implements, by transformers' names. "gelu_pytorch_tanh" is the same tanh
# formula as "gelu_new", computed by torch's fused kernel.
SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "tanh")

_ORIGINAL_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)

# The fields that fix the shapes of the weights: positive integers, and equal in any checkpoint of a model.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)

# transformers keys whose only value we can honour is the given one: anything else would be silently
# ignored by this implementation, so it is refused instead.
_MUST_EQUAL = {
    "position_embedding_type": "absolute",
    "is_decoder": False,
    "add_cross_attention": False,
    "chunk_size_feed_forward": 0,
    "tie_word_embeddings": True,
}

# Keys of transformers' configs that carry no architecture and are kept only so they round-trip.
_HF_BOOKKEEPING = ("model_type", "architectures", "transformers_version", "torch_dtype", "dtype")


@dataclass
class BertConfig:
    """Architecture of a BERT model: the original's 11 fields, in its order, plus transformers' extras.

    Defaults are those of the released BERT-Base `bert_config.json` files. Note `type_vocab_size=2`:
    the original class defaults to 16, and an original `bert_config.json` without the key still reads
    as 16, as in the original.
    """

    vocab_size: int = 30522
    """Size of the WordPiece vocabulary (rows of the word-embedding table)."""
    hidden_size: int = 768
    """Size of the encoder layers and the pooler layer."""
    num_hidden_layers: int = 12
    """Number of Transformer blocks."""
    num_attention_heads: int = 12
    """Attention heads per block; must divide hidden_size."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer inside each block."""
    hidden_act: str = "gelu_new"
    """Activation of the feed-forward layer and the MLM transform, by transformers' names."""
    hidden_dropout_prob: float = 0.1
    """Dropout on the embeddings and on both residual branches of every block."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the model can take (rows of the position table)."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated-normal initialiser."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon; 1e-12 is what tf.contrib.layers.layer_norm hard-codes."""
    pad_token_id: int = 0
    """Id used for padding; the original always pads with 0."""
    classifier_dropout: float | None = None
    """Dropout before a task head; None means hidden_dropout_prob (the original hard-codes 0.1)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this project does not use (e.g. the `pooler_*` keys of the multilingual configs, transformers'
    `id2label`), kept so they survive a round trip."""

    def __post_init__(self) -> None:
        for name in SHAPE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"config field {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise InputError(
                f"config: hidden_size ({self.hidden_size}) is not a multiple of num_attention_heads "
                f"({self.num_attention_heads}); choose a head count that divides it"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise InputError(
                f"config: hidden_act {self.hidden_act!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise InputError(f"config field {name} must be a number in [0, 1), got {value!r}")
        if not _is_number(self.layer_norm_eps) or not 0.0 < self.layer_norm_eps < 1.0:
            raise InputError(
                f"config field layer_norm_eps must be a small positive number, got {self.layer_norm_eps!r}"
            )
        if not _is_number(self.initializer_range) or not 0.0 <= self.initializer_range < math.inf:
            raise InputError(f"config field initializer_range must be a number >= 0, got {self.initializer_range!r}")
        pad = self.pad_token_id
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < self.vocab_size:
            raise InputError(
                f"config field pad_token_id must be an id below vocab_size ({self.vocab_size}), got {pad!r}"
            )

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gelu_form(self) -> str | None:
        """ "tanh" or "erf" for the GELU activations, None for the others."""
        if self.hidden_act == "gelu":
            return "erf"
        if self.hidden_act in ("gelu_new", "gelu_pytorch_tanh"):
            return "tanh"
        return None

    # ----------------------------------------------------------------------------------------- reading
    @classmethod
    def from_dict(cls, d: dict[str, Any], original_gelu: str = "tanh") -> BertConfig:
        """Build a config from an original `bert_config.json` dict or a transformers `config.json` dict.

        Args:
            d: the parsed JSON object.
            original_gelu: "tanh" or "erf": what "gelu" means in a file without `model_type` (an original
                file). The original used erf until 2019-02-07 and tanh since.
        """
        if not isinstance(d, dict):
            raise InputError("config: expected a JSON object of config fields")
        d = dict(d)
        is_original = "model_type" not in d
        if not is_original and d["model_type"] != "bert":
            raise InputError(f"config: model_type {d['model_type']!r} is not 'bert'; this project only builds BERT")
        for key, allowed in _MUST_EQUAL.items():
            if key in d and d[key] != allowed:
                raise InputError(
                    f"config: {key}={d[key]!r} is not supported (only {allowed!r}); remove it or set it so"
                )
        check_task_settings(d, "config")
        kwargs: dict[str, Any] = {}
        if is_original:
            # The original class defaults to 16 segment types; released files always say 2.
            kwargs["type_vocab_size"] = 16
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        extra = dict(d.pop("extra", {}) or {})
        for key, value in d.items():
            if key in known:
                kwargs[key] = value
            else:
                extra[key] = value
        if "vocab_size" not in kwargs or kwargs["vocab_size"] is None:
            raise InputError("config: vocab_size is missing; set it to the number of lines of your vocab.txt")
        act = kwargs.get("hidden_act", "gelu")
        if not isinstance(act, str):
            raise InputError(f"config: hidden_act must be a string, got {act!r}")
        act = act.lower()
        if is_original:
            # Our TF export records the form, since the original spelling cannot tell them apart.
            original_gelu = extra.pop("gelu_form", original_gelu)
            if original_gelu not in ("tanh", "erf"):
                raise InputError(f"original_gelu must be 'tanh' or 'erf', got {original_gelu!r}")
            if act == "gelu":
                act = "gelu_new" if original_gelu == "tanh" else "gelu"
        kwargs["hidden_act"] = act
        for key in _MUST_EQUAL:
            extra.pop(key, None)
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, original_gelu: str = "tanh") -> BertConfig:
        """Read an original `bert_config.json` or a transformers / native `config.json`."""
        if not os.path.isfile(path):
            raise InputError(f"config file {path} does not exist; pass --bert_config_file=PATH")
        d = load_json_file(path, "config file")
        try:
            return cls.from_dict(d, original_gelu=original_gelu)
        except InputError as e:
            raise InputError(f"{path}: {e}") from None
        except TypeError as e:
            raise InputError(f"config file {path} has a field of the wrong type ({e})") from None

    # ----------------------------------------------------------------------------------------- writing
    def to_dict(self) -> dict[str, Any]:
        """The superset dict: original keys, transformers' keys, and the preserved extras."""
        d = copy.deepcopy(self.extra)
        for f in dataclasses.fields(self):
            if f.name != "extra":
                d[f.name] = copy.deepcopy(getattr(self, f.name))
        d["model_type"] = "bert"
        d.setdefault("architectures", ["BertForPreTraining"])
        return d

    def to_json_string(self) -> str:
        """JSON as the original writes it: indent 2, sorted keys, trailing newline."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_original_json_string(self) -> str:
        """An original `bert_config.json`: the 11 keys only, with the original's activation name.

        The original's "gelu" is the tanh form; it has no name for the exact form, so an erf model is
        written as "gelu" too (the original code would then run it with tanh, 5e-4 away at most), with
        an extra key `gelu_form` that the original ignores and `from_dict` reads back.
        """
        d = {k: getattr(self, k) for k in _ORIGINAL_KEYS}
        d["hidden_act"] = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}.get(self.hidden_act, self.hidden_act)
        if self.gelu_form is not None:
            d["gelu_form"] = self.gelu_form  # an extra key: ignored by the original, read back by from_dict
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str | os.PathLike) -> None:
        with atomic_write(path) as f:
            f.write(self.to_json_string())

    def check_max_seq_length(self, max_seq_length: int, name: str = "max_seq_length") -> None:
        """The one rule for a sequence length this model runs at: from MIN_SEQ_LENGTH to max_position_embeddings.
        `bert.inference.Predictor` holds a model's saved length to it, so every training run is held to it
        before it starts (`bert.starting_model`): a run never exports a model `bert embed` or `bert predict`
        would refuse. `name` is the flag or setting named in the error."""
        limit = self.max_position_embeddings
        if not MIN_SEQ_LENGTH <= max_seq_length <= limit:
            raise InputError(
                f"{name}={max_seq_length} must be between {MIN_SEQ_LENGTH} and max_position_embeddings={limit} "
                f"(the model's); give a length in that range"
            )

    def validate_vocab(self, vocab_size_of_file: int, vocab_file: str | os.PathLike) -> None:
        """Refuse a vocab with more entries than the embedding table: the original trains into NaNs."""
        if vocab_size_of_file > self.vocab_size:
            raise InputError(
                f"vocab file {vocab_file} has {vocab_size_of_file} entries but the config's vocab_size is "
                f"{self.vocab_size}; ids above {self.vocab_size - 1} have no embedding. Use the vocab the model "
                f"was trained with, or set vocab_size to at least {vocab_size_of_file}"
            )


# The released model shapes, so pre-training from scratch needs no hand-written config. The 24 small
# models (README, 2020-03-11) have H/64 heads and a 4H feed-forward layer.
def named_config(name: str, vocab_size: int = 30522) -> BertConfig:
    """A config for a released shape: "base", "large", "tiny", "mini", "small", "medium", or "L-4_H-256"."""
    aliases = {
        "tiny": "L-2_H-128",
        "mini": "L-4_H-256",
        "small": "L-4_H-512",
        "medium": "L-8_H-512",
        "base": "L-12_H-768",
        "large": "L-24_H-1024",
    }
    spec = aliases.get(name.lower(), name)
    parts = dict(p.split("-", 1) for p in spec.split("_") if "-" in p)
    try:
        layers, hidden = int(parts["L"]), int(parts["H"])
    except (KeyError, ValueError):
        raise InputError(
            f"unknown model shape {name!r}; use a bert_config.json path, one of {', '.join(aliases)}, "
            "or L-<layers>_H-<hidden>"
        ) from None
    heads = int(parts.get("A", hidden // 64))
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
    )


def resolve_config(spec: str | os.PathLike, vocab_size: int | None = None) -> BertConfig:
    """--bert_config_file: a config from a JSON file path or, if no such file exists, from a released shape's
    name (with `vocab_size`, 30522 by default)."""
    if os.path.exists(spec):
        return BertConfig.from_json_file(spec)
    text = str(spec)
    if text.lower().endswith(".json") or "/" in text or os.sep in text:
        raise InputError(f"--bert_config_file={text}: no such file (nor a released shape's name such as tiny or base)")
    return named_config(text, vocab_size=vocab_size or 30522)
