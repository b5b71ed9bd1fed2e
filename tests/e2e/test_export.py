"""`bert export` end to end on tiny random models of every head: the TorchScript and ONNX files load in
their runtimes (torch.jit.load, ONNX Runtime's CPU provider) and equal the eager model on inputs of
another batch size and length than the traced example; a graph that fails the export-time check is not
written; int8 exports stay close to fp32."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from bert.checkpoint import save_pretrained
from bert.cli import main
from bert.export import INPUT_NAMES, OUTPUT_NAMES, RUNNERS, ExportGraph
from bert.loading import load_model
from bert.modeling import MODEL_CLASSES, BertForMultipleChoice
from conftest import FIXTURES, cli_error

VOCAB = FIXTURES / "tf_checkpoint" / "tiny" / "vocab.txt"
# torch.jit.load warns that TorchScript is deprecated; loading it is what these tests are for.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
HEAD_KWARGS = {"BertForSequenceClassification": {"num_labels": 3}, "BertForTokenClassification": {"num_labels": 5}}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """architecture -> a saved tiny random model of that class (99-token vocab, 2 layers, hidden 32)."""
    from bert.config import BertConfig

    config = BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        hidden_act="gelu",
    )
    root = tmp_path_factory.mktemp("heads")
    dirs = {}
    for name, cls in MODEL_CLASSES.items():
        torch.manual_seed(0)
        save_pretrained(cls(config, **HEAD_KWARGS.get(name, {})), root / name, VOCAB, do_lower_case=True)
        dirs[name] = root / name
    return dirs


def other_inputs(model) -> dict[str, torch.Tensor]:
    """5 (x 3 choices) x 23 tokens, rows of decreasing length: neither the example's 2 x 8 nor a checked shape."""
    g = torch.Generator().manual_seed(1)
    shape = (5, 3, 23) if isinstance(model, BertForMultipleChoice) else (5, 23)
    ids = torch.randint(0, 99, shape, generator=g)
    lengths = torch.tensor([23, 20, 9, 4, 15])
    mask = (torch.arange(23) < lengths.view(5, *[1] * (len(shape) - 1))).long().expand(shape).contiguous()
    types = (torch.arange(23) >= 6).long().expand(shape).contiguous() * mask
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}


def assert_matches_eager(model_dir, outputs: list[np.ndarray], inputs: dict[str, torch.Tensor], atol=1e-4):
    """The eager model as users run it (automatic unpadding), compared at real tokens (padded ones are zeros there)."""
    model, _ = load_model(model_dir)
    with torch.no_grad():
        expected = ExportGraph(model)(**inputs)
    mask = inputs["attention_mask"].bool().numpy()
    assert len(outputs) == len(expected)
    for got, exp in zip(outputs, expected):
        exp = exp.numpy()
        assert got.shape == exp.shape
        if exp.shape[: mask.ndim] == mask.shape:  # per-token output: compare real tokens only
            got, exp = got[mask], exp[mask]
        np.testing.assert_allclose(got, exp, atol=atol, rtol=0)


@pytest.mark.parametrize("architecture", list(MODEL_CLASSES))
def test_torchscript_every_head(model_dirs, tmp_path, architecture):
    out = tmp_path / "ts" / "model.pt"
    assert main(["export", f"--model={model_dirs[architecture]}", "--format=torchscript", f"--output={out}"]) == 0
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        assert (out.parent / name).is_file(), name
    assert json.loads((out.parent / "config.json").read_text())["architectures"] == [architecture]
    record = json.loads((tmp_path / "ts" / "model.pt.args.json").read_text())
    assert record["result"]["max_abs_diff"] <= 1e-4 and record["result"]["outputs"] == list(OUTPUT_NAMES[architecture])

    model, _ = load_model(model_dirs[architecture])
    inputs = other_inputs(model)
    module = torch.jit.load(str(out))
    with torch.no_grad():
        outputs = [o.numpy() for o in module(*(inputs[n] for n in INPUT_NAMES))]
    assert_matches_eager(model_dirs[architecture], outputs, inputs)


@pytest.mark.parametrize("architecture", list(MODEL_CLASSES))
def test_onnx_every_head(model_dirs, tmp_path, architecture):
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    out = tmp_path / "onnx"
    out.mkdir()
    assert main(["export", f"--model={model_dirs[architecture]}", "--format=onnx", f"--output={out}"]) == 0
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(INPUT_NAMES)
    assert [o.name for o in session.get_outputs()] == list(OUTPUT_NAMES[architecture])
    axes = session.get_inputs()[0].shape
    assert all(isinstance(a, str) for a in axes), axes  # every input axis is dynamic

    model, _ = load_model(model_dirs[architecture])
    inputs = other_inputs(model)
    outputs = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    assert_matches_eager(model_dirs[architecture], outputs, inputs)


def test_a_graph_that_fails_the_check_is_not_written(model_dirs, tmp_path, capsys, monkeypatch):
    real = RUNNERS["torchscript"]

    def off_by_a_little(path):
        run = real(path)
        return lambda inputs: [o + 1e-3 for o in run(inputs)]

    monkeypatch.setitem(RUNNERS, "torchscript", off_by_a_little)
    out = tmp_path / "model.pt"
    out.write_bytes(b"an earlier export")
    line = cli_error(
        capsys,
        "export",
        f"--model={model_dirs['BertForSequenceClassification']}",
        "--format=torchscript",
        f"--output={out}",
    )
    assert (
        "does not match the eager model" in line
        and "difference 0.001 > 0.0001" in line
        and "nothing was written" in line
    )
    assert out.read_bytes() == b"an earlier export"  # what was there is kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temporary files, no sidecars


def test_onnx_without_the_extra_names_the_install_command(model_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    line = cli_error(capsys, "export", f"--model={model_dirs['BertModel']}", f"--output={tmp_path / 'm.onnx'}")
    assert 'pip install "bert[onnx]"' in line
    assert list(tmp_path.iterdir()) == []


def test_unknown_architecture_is_one_line(model_dirs, tmp_path, capsys):
    src = model_dirs["BertModel"]
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    line = cli_error(capsys, "export", f"--model={bad}", "--format=torchscript", f"--output={tmp_path / 'm.pt'}")
    assert "BertForMaskedLM" in line and "BertForSequenceClassification" in line
    assert not (tmp_path / "m.pt").exists()


def test_torchscript_int8_equals_the_quantized_eager_model(model_dirs, tmp_path):
    from bert.quantization import quantize_int8

    src = model_dirs["BertForTokenClassification"]
    out = tmp_path / "int8.pt"
    assert main(["export", f"--model={src}", "--format=torchscript", "--quantize=int8", f"--output={out}"]) == 0
    model, _ = load_model(src)
    inputs = other_inputs(model)
    with torch.no_grad():
        got = torch.jit.load(str(out))(*(inputs[n] for n in INPUT_NAMES))[0]
        fp32 = ExportGraph(model)(**inputs)[0]
        # As export traces it: the padded path, whose padded rows count in each int8 input's range (unpadded, the
        # eager model's ranges are of the real tokens alone).
        model.set_unpad(False)
        int8 = ExportGraph(quantize_int8(model, bf16_products=False))(**inputs)[0]
    mask = inputs["attention_mask"].bool()
    torch.testing.assert_close(got[mask], int8[mask], atol=1e-4, rtol=0)
    assert 0 < float((got - fp32)[mask].abs().max()) < 0.05 * float(fp32.abs().max())  # quantized, and close


def test_onnx_int8_is_smaller_and_close_to_fp32(model_dirs, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
    from bert.config import BertConfig

    # A shape where the Linear layers hold most weights, as in real models (the tiny one is mostly embeddings).
    config = BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    save_pretrained(MODEL_CLASSES["BertModel"](config), tmp_path / "m", VOCAB, do_lower_case=True)
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    assert main(["export", f"--model={tmp_path / 'm'}", f"--output={fp32}"]) == 0
    assert main(["export", f"--model={tmp_path / 'm'}", "--quantize=int8", f"--output={int8}"]) == 0
    assert int8.stat().st_size < 0.5 * fp32.stat().st_size
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(int8)).graph.node}
    model, _ = load_model(tmp_path / "m")
    inputs = {k: v.numpy() for k, v in other_inputs(model).items()}
    a = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    b = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    assert 0 < np.abs(a - b).max() < 0.05 * np.abs(a).max()


def test_transformers_model_exports_to_its_own_outputs(tmp_path):
    """A directory written by transformers' save_pretrained exports, and the graph gives transformers' outputs."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        num_labels=3,
    )
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "vocab.txt").write_bytes(VOCAB.read_bytes())
    out = tmp_path / "model.pt"
    assert main(["export", f"--model={tmp_path / 'hf'}", "--format=torchscript", f"--output={out}"]) == 0
    model, _ = load_model(tmp_path / "hf")
    inputs = other_inputs(model)
    with torch.no_grad():
        got = torch.jit.load(str(out))(*(inputs[n] for n in INPUT_NAMES))[0]
        expected = hf(**inputs).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
