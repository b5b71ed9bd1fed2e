"""`Predictor.from_pretrained(..., backend="onnx")`: the file `bert export` wrote, run by ONNX Runtime, gives
the torch model's answers; `bert export --optimize` writes ONNX Runtime's optimized graph, checked the same way.
The inference commands' `--backend=onnx` gives the answers of `--backend=torch`, and `bert serve --backend=onnx`
those of the offline command."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from bert.cli import main
from bert.errors import InputError
from bert.inference import Predictor
from bert.modeling import BertForPreTraining, BertForSequenceClassification, BertModel
from conftest import cli_error, save_model_dir, uncased_vocab, vocab_config

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
TEXTS = ["The cat sat on the mat.", "a much longer sentence, with more words than the first one has", "yes"]
PAIRS = [("He said so.", "He did say that."), ("Rain today.", None), ("A b c d e f g.", "h i j")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{architecture: (model directory, export directory)} for a tiny encoder, a 3-label classifier and a
    pre-training model (masked-LM head)."""
    root = tmp_path_factory.mktemp("onnx_backend")
    vocab = uncased_vocab(root)
    out = {}
    for name, model in (
        ("BertModel", BertModel(vocab_config(vocab))),
        ("BertForSequenceClassification", BertForSequenceClassification(vocab_config(vocab), num_labels=3)),
        ("BertForPreTraining", BertForPreTraining(vocab_config(vocab))),
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
    with pytest.raises(InputError, match="model.onnx: no such file"):
        Predictor.from_pretrained(src, backend="onnx")  # weights, not an export
    with pytest.raises(InputError, match="no ONNX model there"):
        Predictor.from_pretrained(src / "model.safetensors", backend="onnx")
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


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _command_output(tmp_path, command, model, backend, *flags):
    """What `bert COMMAND --model=MODEL --backend=BACKEND` writes: the .npy of embed, else its JSON lines."""
    out = tmp_path / f"{command}-{backend}.{'npy' if command == 'embed' else 'jsonl'}"
    argv = [command, f"--model={model}", f"--backend={backend}", f"--output_file={out}", *flags]
    assert main(argv) == 0
    return np.load(out) if command == "embed" else [json.loads(line) for line in out.read_text().splitlines()]


def _numbers(record):
    """The numbers of a JSON answer, in order, and its structure with every number replaced by 0."""
    if isinstance(record, dict):
        parts = [(k, *_numbers(v)) for k, v in sorted(record.items())]
        return [x for _, xs, _ in parts for x in xs], {k: shape for k, _, shape in parts}
    if isinstance(record, list):
        parts = [_numbers(v) for v in record]
        return [x for xs, _ in parts for x in xs], [shape for _, shape in parts]
    if isinstance(record, float):
        return [record], 0
    return [], record


@pytest.mark.parametrize(
    "command, architecture, inputs",
    [
        ("embed", "BertModel", lambda d: ["--pooling=cls", f"--input_file={_write(d / 'in.txt', TEXTS)}"]),
        (
            "predict",
            "BertForSequenceClassification",
            lambda d: [
                "--top_k=0",
                f"--input_file={_write(d / 'in.jsonl', [json.dumps({'text': a, 'text_pair': b}) for a, b in PAIRS])}",
            ],
        ),
        (
            "rerank",
            "BertModel",
            lambda d: [f"--input_file={_write(d / 'in.jsonl', [json.dumps({'query': 'cat', 'documents': TEXTS})])}"],
        ),
        (
            "search",
            "BertModel",
            lambda d: [f"--corpus={_write(d / 'corpus.txt', TEXTS)}", f"--queries={_write(d / 'q.txt', ['cat', 'b'])}"],
        ),
        (
            "fill-mask",
            "BertForPreTraining",
            lambda d: [
                "--top_k=3",
                f"--input_file={_write(d / 'in.txt', ['The [MASK] sat on the [MASK].', 'a [MASK]'])}",
            ],
        ),
    ],
)
def test_backend_flag_onnx_equals_torch(exported, tmp_path, command, architecture, inputs):
    src, onnx_dir = exported[architecture]
    flags = inputs(tmp_path)
    torch_out = _command_output(tmp_path, command, src, "torch", *flags)
    onnx_out = _command_output(tmp_path, command, onnx_dir, "onnx", *flags)
    if command == "embed":
        assert onnx_out.shape == torch_out.shape == (len(TEXTS), 32)
        np.testing.assert_allclose(onnx_out, torch_out, atol=1e-5)
        return
    (got, got_shape), (want, want_shape) = _numbers(onnx_out), _numbers(torch_out)
    assert got_shape == want_shape and len(got) >= 2  # the same labels, documents and order
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_backend_flag_errors_are_one_line(exported, tmp_path, capsys):
    src, onnx_dir = exported["BertModel"]
    texts = _write(tmp_path / "in.txt", TEXTS)
    line = cli_error(capsys, "embed", f"--model={src}", "--backend=onnx", f"--input_file={texts}")
    assert f"{src / 'model.onnx'}: no such file" in line and f"`bert export --model={src} --output=" in line
    line = cli_error(capsys, "predict", f"--model={onnx_dir}", "--backend=onnx", "--device=cuda")
    assert "--backend=onnx runs on the CPU" in line and "drop --device=cuda" in line
    line = cli_error(capsys, "serve", f"--model={onnx_dir}", "--backend=onnx", "--quantize=int8")
    assert "drop --quantize=int8" in line and "bert export --quantize=int8" in line


@pytest.mark.parametrize("command", ["predict", "embed", "rerank", "search", "fill-mask", "serve"])
def test_backend_flag_conflicts_are_refused_before_torch_loads(exported, tmp_path, command):
    _, onnx_dir = exported["BertModel"]
    texts = _write(tmp_path / "in.txt", TEXTS)
    argv = [command, f"--model={onnx_dir}", "--backend=onnx", "--device=cuda"]
    argv += [f"--corpus={texts}", f"--queries={texts}"] if command == "search" else []
    code = f"import sys; from bert.cli import main; print(main({argv!r}), 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert (
        result.stderr.strip()
        == f"bert {command}: error: --backend=onnx runs on the CPU (ONNX Runtime's CPU provider): drop --device=cuda"
    )


def test_backend_onnx_without_onnx_runtime_is_one_line(exported, monkeypatch, capsys):
    _, onnx_dir = exported["BertModel"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    line = cli_error(capsys, "embed", f"--model={onnx_dir}", "--backend=onnx")
    assert "backend onnx needs ONNX Runtime: pip install onnxruntime" in line


def test_serve_backend_onnx_embeds_as_the_offline_command(exported, tmp_path):
    # The serve extra is optional: without it only this test is skipped.
    pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")
    from test_serve import call, inprocess_server

    from bert.commands.serve import ServeArgs, build_app

    _, onnx_dir = exported["BertModel"]
    offline = _command_output(tmp_path, "embed", onnx_dir, "onnx", f"--input_file={_write(tmp_path / 'in', TEXTS)}")
    app = build_app(ServeArgs(model=str(onnx_dir), backend="onnx", threads=1))
    with inprocess_server(app=app) as port:
        status, _, vectors = call(port, "/embed", {"inputs": TEXTS, "normalize": False})
        assert status == 200
        np.testing.assert_allclose(np.array(vectors, dtype=np.float32), offline, atol=1e-6)
        status, _, info = call(port, "/info")
        assert status == 200 and info["backend"] == "onnx" and info["model_type"] == {"embedding": {"pooling": "mean"}}


def test_serve_check_backend_onnx_asks_a_head_graph_only_its_routes(exported, capsys):
    # A classifier's graph has its logits only: the embedding routes are not checked, /predict is.
    pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")
    _, onnx_dir = exported["BertForSequenceClassification"]
    assert main(["serve", f"--model={onnx_dir}", "--backend=onnx", "--check", "--threads=1"]) == 0
    routes = [line.split(" -> ")[0] for line in capsys.readouterr().out.splitlines() if " -> " in line]
    assert "POST /predict" in routes and "GET /info" in routes and "POST /embed" not in routes


def test_serve_backend_onnx_head_graph_answers_424_on_the_embedding_routes(exported):
    # What --check skips is what the server refuses: the table's one rule of which models a route serves.
    pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")
    from test_serve import call, inprocess_server

    from bert.commands.serve import ServeArgs, build_app

    _, onnx_dir = exported["BertForSequenceClassification"]
    app = build_app(ServeArgs(model=str(onnx_dir), backend="onnx", threads=1))
    with inprocess_server(app=app) as port:
        for path, body in [("/embed", {"inputs": TEXTS[0]}), ("/v1/embeddings", {"input": TEXTS[0]})]:
            status, _, error = call(port, path, body)
            message = error["error"]["message"] if path.startswith("/v1/") else error["error"]
            assert status == 424 and f"{path} needs an embedding model" in message, error
        assert call(port, "/predict", {"inputs": TEXTS[0]})[0] == 200
