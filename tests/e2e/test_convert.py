"""`bert convert` keeps the model it is given: all-MiniLM-L6-v2 (a head-less BertModel with
sentence-transformers files) through native, transformers and TF formats and back gives `bert embed` the
same vectors and stays a BertModel; heads are added only with --add_heads, which says they are random."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file
from test_embed import minilm_dir, stsb_sentences, write_lines

from bert.checkpoint import save_pretrained
from bert.cli import main
from bert.config import named_config
from bert.formats import tf_checkpoint
from bert.modeling import BertModel
from conftest import cli_error


def _embed(model: Path, tmp_path: Path, name: str) -> np.ndarray:
    out = tmp_path / f"{name}.npy"
    assert main(["embed", f"--model={model}", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={out}"]) == 0
    return np.load(out)


@pytest.fixture(scope="module")
def minilm_formats(tmp_path_factory):
    """all-MiniLM-L6-v2 converted native -> hf -> tf -> native, and bert embed's vectors of each."""
    tmp = tmp_path_factory.mktemp("convert")
    write_lines(tmp / "in.txt", stsb_sentences(8))
    dirs = {"source": minilm_dir()}
    for src, fmt, name in [("source", "native", "native"), ("native", "hf", "hf"), ("hf", "tf", "tf")]:
        assert main(["convert", f"--input={dirs[src]}", f"--output={tmp / name}", f"--format={fmt}"]) == 0
        dirs[name] = tmp / name
    assert main(["convert", f"--input={dirs['tf']}", f"--output={tmp / 'back'}", "--format=native"]) == 0
    dirs["back"] = tmp / "back"
    return dirs, {name: _embed(d, tmp, name) for name, d in dirs.items()}


def test_minilm_round_trip_keeps_the_vectors(minilm_formats):
    _, vectors = minilm_formats
    assert np.allclose(np.linalg.norm(vectors["source"], axis=1), 1.0, atol=1e-5)  # sentence-transformers' own
    for name in ("native", "hf", "tf", "back"):
        np.testing.assert_allclose(vectors[name], vectors["source"], atol=1e-5, rtol=0, err_msg=name)


def test_minilm_round_trip_keeps_the_architecture_and_sentence_transformers_files(minilm_formats):
    dirs, _ = minilm_formats
    for name in ("native", "hf", "back"):
        assert json.loads((dirs[name] / "config.json").read_text())["architectures"] == ["BertModel"], name
    for name in ("native", "hf", "tf", "back"):
        for f in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
            assert (dirs[name] / f).is_file(), (name, f)
    assert not any(n.startswith("cls/") for n in _tf_names(dirs["tf"]))


def _tf_names(directory: Path) -> list[str]:
    return list(tf_checkpoint.load_variables(str(directory / "bert_model.ckpt")))


def test_heads_are_added_only_when_asked_and_named_random(minilm_formats, tmp_path, capsys):
    dirs, _ = minilm_formats
    line = cli_error(
        capsys, "convert", f"--input={dirs['native']}", f"--output={tmp_path / 'a'}", "--model_class=BertForPreTraining"
    )
    assert "is a BertModel" in line and "randomly initialised" in line and "--add_heads" in line
    assert not (tmp_path / "a").exists()
    assert main(["convert", f"--input={dirs['native']}", f"--output={tmp_path / 'b'}", "--add_heads"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: --add_heads:" in err and "cls.predictions" in err
    assert json.loads((tmp_path / "b" / "config.json").read_text())["architectures"] == ["BertForPreTraining"]


def test_result_block_names_what_was_written_and_the_next_command(minilm_formats, capsys):
    dirs, _ = minilm_formats
    capsys.readouterr()
    out = dirs["native"].parent / "block"
    assert main(["convert", f"--input={dirs['native']}", f"--output={out}"]) == 0
    err = capsys.readouterr().err
    assert "bert convert: done" in err and f"written as native to {out}" in err
    assert "BertModel" in err and f"next: bert embed --model={out}" in err
    assert "sentence-transformers files carried: modules.json" in err


def test_a_bert_model_without_pooler_stays_without_one(tmp_path):
    save_pretrained(BertModel(named_config("tiny", vocab_size=99), add_pooling_layer=False), tmp_path / "src")
    assert main(["convert", f"--input={tmp_path / 'src'}", f"--output={tmp_path / 'out'}"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["BertModel"]
    assert not [k for k in load_file(tmp_path / "out" / "model.safetensors") if "pooler" in k]
