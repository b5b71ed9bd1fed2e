"""A model directory is checked as a whole before use: a wrong field in any of its files is one line naming
the file and the field, before a model of that config is allocated.

- `test_broken_model_directory`: each case of a probe (a classifier with 0 labels, a `.bin` holding a
  non-tensor, a 0-byte `.bin`, `layer_norm_eps: "abc"`, task settings of the wrong type, a
  `tokenizer_config.json` or `1_Pooling/config.json` that is a list, sizes larger than the weights on disk,
  NaN weights) -> `bert predict` / `bert embed` exit 2 with one line naming the file and the field.
- `test_any_config_field_of_any_type` and `test_any_tensor_shape` (hypothesis): any value in any config
  field, any shape for any tensor -> a Predictor, or an `InputError`; never another exception.
- `test_nan_results_are_refused`: a result holding NaN is an error, never a bare `NaN` in the output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from bert.errors import InputError
from bert.inference import Predictor
from bert.modeling import BertForSequenceClassification, BertModel
from bert.utils import json_line
from conftest import cli_error, save_model_dir, vocab_config

WORDS = ["the", "cat", "sat", "on", "mat", "a", "good", "day", "."]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """{"classifier", "st"}: a tiny 2-label classifier and a sentence-transformers encoder directory."""
    d = tmp_path_factory.mktemp("dirs")
    vocab = d / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    save_model_dir(BertForSequenceClassification(vocab_config(vocab), num_labels=2), d / "classifier", vocab)
    encoder = save_model_dir(BertModel(vocab_config(vocab)), d / "st", vocab)
    (encoder / "modules.json").write_text(
        json.dumps([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    )  # fmt: skip
    (encoder / "1_Pooling").mkdir()
    (encoder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (encoder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    return {"classifier": d / "classifier", "st": encoder}


def _edit_json(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _edit_weights(model: Path, edit) -> None:
    state = load_file(model / "model.safetensors")
    edit(state)
    save_file(state, model / "model.safetensors")  # without the digest: the damage is the case itself


def _zero_labels(m: Path) -> None:
    def edit(state):
        state["classifier.weight"] = torch.zeros(0, 32)
        state["classifier.bias"] = torch.zeros(0)

    _edit_weights(m, edit)


def _bin(m: Path, content) -> None:
    (m / "model.safetensors").unlink()
    if content is None:
        (m / "pytorch_model.bin").write_bytes(b"")
    else:
        torch.save(content, m / "pytorch_model.bin")


def _nan(m: Path) -> None:
    def edit(state):
        state["bert.encoder.layer.1.output.dense.weight"][0, 0] = float("nan")

    _edit_weights(m, edit)


# name -> (directory, how to break it, the words the one line must hold)
CASES = {
    "zero_labels": ("classifier", _zero_labels, ["classifier.weight", "shape (0, 32)"]),
    "bin_non_tensor": (
        "classifier",
        lambda m: _bin(m, {"bert.pooler.dense.bias": "abc"}),
        ["pytorch_model.bin", "'bert.pooler.dense.bias' holds a str"],
    ),  # fmt: skip
    "zero_byte_bin": ("classifier", lambda m: _bin(m, None), ["pytorch_model.bin", "cannot be read"]),
    "layer_norm_eps": (
        "classifier",
        lambda m: _edit_json(m / "config.json", layer_norm_eps="abc"),
        ["config.json", "layer_norm_eps"],
    ),  # fmt: skip
    "max_seq_length": (
        "classifier",
        lambda m: _edit_json(m / "config.json", max_seq_length="128"),
        ["config.json", "max_seq_length must be a positive integer"],
    ),  # fmt: skip
    "doc_stride": (
        "classifier",
        lambda m: _edit_json(m / "config.json", doc_stride=[1]),
        ["config.json", "doc_stride"],
    ),
    "problem_type": (
        "classifier",
        lambda m: _edit_json(m / "config.json", problem_type=5),
        ["config.json", "problem_type"],
    ),  # fmt: skip
    "label_thresholds": (
        "classifier",
        lambda m: _edit_json(m / "config.json", label_thresholds=[0.5]),
        ["config.json", "label_thresholds"],
    ),  # fmt: skip
    "tokenizer_config": (
        "classifier",
        lambda m: (m / "tokenizer_config.json").write_text("[true]"),
        ["tokenizer_config.json", "expected a JSON object"],
    ),  # fmt: skip
    "pooling_config": (
        "st",
        lambda m: (m / "1_Pooling" / "config.json").write_text("[]"),
        ["1_Pooling/config.json", "expected a JSON object"],
    ),  # fmt: skip
    "st_config": (
        "st",
        lambda m: _edit_json(m / "sentence_bert_config.json", max_seq_length=1.5),
        ["sentence_bert_config.json", "max_seq_length"],
    ),  # fmt: skip
    "vocab_size": (
        "classifier",
        lambda m: _edit_json(m / "config.json", vocab_size=10**9),
        ["config.json", "vocab_size=1000000000", "has 14"],
    ),  # fmt: skip
    "max_position_embeddings": (
        "classifier",
        lambda m: _edit_json(m / "config.json", max_position_embeddings=10**8),
        ["config.json", "max_position_embeddings=100000000", "has 64"],
    ),  # fmt: skip
    "num_hidden_layers": (
        "classifier",
        lambda m: _edit_json(m / "config.json", num_hidden_layers=100000),
        ["config.json", "num_hidden_layers=100000", "holds 2 layers"],
    ),  # fmt: skip
    "nan_weights": ("classifier", _nan, ["model.safetensors", "layer.1.output.dense.weight holds NaN"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broken_model_directory(capsys, tmp_path, dirs, case):
    which, damage, words = CASES[case]
    model = tmp_path / which
    shutil.copytree(dirs[which], model)
    damage(model)
    text = tmp_path / "in.txt"
    text.write_text("the cat sat on the mat .\n")
    command = "embed" if which == "st" else "predict"
    line = cli_error(capsys, command, f"--model={model}", f"--input_file={text}", f"--output_file={tmp_path / 'o'}")
    for word in words:
        assert word in line, line
    assert not (tmp_path / "o").exists()


def test_nan_results_are_refused():
    with pytest.raises(InputError, match="NaN or infinity"):
        json_line({"score": float("nan")})
    assert json.loads(json_line({"score": 0.5})) == {"score": 0.5}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)
FIELDS = [
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout", "model_type", "architectures",
    "id2label", "problem_type", "label_thresholds", "max_seq_length", "doc_stride", "n_best_size",
    "max_answer_length", "max_query_length", "version_2_with_negative", "null_score_diff_threshold",
]  # fmt: skip


def _load_or_refuse(model: Path) -> None:
    try:
        predictor = Predictor.from_pretrained(model, "cpu")
    except InputError as e:
        assert "\n" not in str(e)
        return
    predictor.classify(["the cat sat"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=JSON_VALUES)
def test_any_config_field_of_any_type(tmp_path_factory, dirs, field, value):
    model = tmp_path_factory.mktemp("m") / "m"
    shutil.copytree(dirs["classifier"], model)
    _edit_json(model / "config.json", **{field: value})
    _load_or_refuse(model)


def test_architectures_that_are_not_names_are_refused(tmp_path, dirs):
    # Found by the property test above: a list inside `architectures` reached a set lookup (TypeError).
    model = tmp_path / "m"
    shutil.copytree(dirs["classifier"], model)
    _edit_json(model / "config.json", architectures=[["BertForSequenceClassification"]])
    with pytest.raises(InputError, match="names the architecture"):
        Predictor.from_pretrained(model, "cpu")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 1000), shape=st.lists(st.integers(0, 70), min_size=0, max_size=3))
def test_any_tensor_shape(tmp_path_factory, dirs, index, shape):
    model = tmp_path_factory.mktemp("m") / "m"
    shutil.copytree(dirs["classifier"], model)

    def edit(state):
        key = sorted(state)[index % len(state)]
        state[key] = torch.zeros(shape)

    _edit_weights(model, edit)
    _load_or_refuse(model)
