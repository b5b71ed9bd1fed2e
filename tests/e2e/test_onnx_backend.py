"""`Predictor.from_pretrained(..., backend="onnx")`: the file `bert export` wrote, run by ONNX Runtime, gives
the torch model's answers; `bert export --optimize` writes ONNX Runtime's optimized graph, checked the same way."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert.cli import main
from bert.errors import InputError
from bert.inference import Predictor
from bert.modeling import BertForSequenceClassification, BertModel
from conftest import cli_error, save_model_dir, uncased_vocab, vocab_config

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
TEXTS = ["The cat sat on the mat.", "a much longer sentence, with more words than the first one has", "yes"]
PAIRS = [("He said so.", "He did say that."), ("Rain today.", None), ("A b c d e f g.", "h i j")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{architecture: (model directory, export directory)} for a tiny encoder and a 3-label classifier."""
    root = tmp_path_factory.mktemp("onnx_backend")
    vocab = uncased_vocab(root)
    out = {}
    for name, model in (
        ("BertModel", BertModel(vocab_config(vocab))),
        ("BertForSequenceClassification", BertForSequenceClassification(vocab_config(vocab), num_labels=3)),
    ):
        src = save_model_dir(model, root / name, vocab, id2label={0: "a", 1: "b", 2: "c"})
        assert main(["export", f"--model={src}", f"--output={root / (name + '_onnx')}/"]) == 0
        out[name] = (src, root / (name + "_onnx"))
    return out


def test_onnx_embeddings_equal_torch(exported):
    src, onnx_dir = exported["BertModel"]
    torch_side, onnx_side = Predictor.from_pretrained(src, "cpu"), Predictor.from_pretrained(onnx_dir, backend="onnx")
    for pooling in ("mean", "cls", "pooler"):
        np.testing.assert_allclose(
            onnx_side.embed(TEXTS, pooling=pooling), torch_side.embed(TEXTS, pooling=pooling), atol=1e-5
        )


def test_onnx_classification_equals_torch_and_refuses_embed(exported):
    src, onnx_dir = exported["BertForSequenceClassification"]
    onnx_side = Predictor.from_pretrained(onnx_dir / "model.onnx", backend="onnx")  # the file itself
    expected = Predictor.from_pretrained(src, "cpu").classify(PAIRS, top_k=None)
    got = onnx_side.classify(PAIRS, top_k=None)
    assert [[r["label"] for r in row["scores"]] for row in got] == [
        [r["label"] for r in row["scores"]] for row in expected
    ]
    np.testing.assert_allclose(
        [[r["score"] for r in row["scores"]] for row in got],
        [[r["score"] for r in row["scores"]] for row in expected],
        atol=1e-5,
    )
    with pytest.raises(InputError, match="head's outputs only"):
        onnx_side.embed(TEXTS)


def test_onnx_backend_bad_arguments_are_one_line(exported, tmp_path):
    src, onnx_dir = exported["BertModel"]
    with pytest.raises(InputError, match="no ONNX model there"):
        Predictor.from_pretrained(src, backend="onnx")  # weights, not an export
    with pytest.raises(InputError, match="bert export --quantize=int8"):
        Predictor.from_pretrained(onnx_dir, backend="onnx", quantize="int8")
    with pytest.raises(InputError, match="backend='tensorrt' must be one of torch, onnx"):
        Predictor.from_pretrained(onnx_dir, backend="tensorrt")


def test_export_optimize_fuses_and_matches_eager(exported, tmp_path):
    onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
    src, plain = exported["BertModel"]
    out = tmp_path / "opt.onnx"
    assert main(["export", f"--model={src}", "--optimize", f"--output={out}"]) == 0
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "SkipLayerNormalization" in ops and "SkipLayerNormalization" not in {
        n.op_type for n in onnx.load(str(plain / "model.onnx")).graph.node
    }
    record = json.loads((tmp_path / "opt.onnx.args.json").read_text())
    assert record["result"]["optimize"] is True and record["result"]["max_abs_diff"] <= 1e-4
    torch_side = Predictor.from_pretrained(src, "cpu")
    np.testing.assert_allclose(
        Predictor.from_pretrained(out, backend="onnx").embed(TEXTS), torch_side.embed(TEXTS), atol=1e-5
    )


def test_export_optimize_needs_onnx(exported, tmp_path, capsys):
    src, _ = exported["BertModel"]
    line = cli_error(capsys, "export", f"--model={src}", "--format=torchscript", "--optimize", f"--output={tmp_path}/")
    assert "--optimize" in line and "--format=onnx" in line
    assert list(tmp_path.iterdir()) == []
