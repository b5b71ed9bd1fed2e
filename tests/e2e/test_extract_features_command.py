"""extract-features reproduces the original's JSON lines: keys, key order and tokens exactly, values within 1e-5."""

import json
import subprocess
import sys

import pytest

from bert.cli import main
from conftest import FIXTURES

CKPT = FIXTURES / "tf_checkpoint" / "tiny"
EF = FIXTURES / "extract_features"


def _args(out, **extra):
    args = {
        "input_file": EF / "input.txt",
        "output_file": out,
        "vocab_file": CKPT / "vocab.txt",
        "bert_config_file": CKPT / "bert_config.json",
        "init_checkpoint": CKPT / "bert_model.ckpt",
        "layers": "-1,-2",
        "max_seq_length": 24,
        "batch_size": 2,
        "do_lower_case": "true",
    }
    args.update(extra)
    return [f"--{k}={v}" for k, v in args.items()]


def _compare(path):
    expected = [json.loads(line) for line in (EF / "expected_output.jsonl").read_text().splitlines()]
    got_lines = path.read_text().splitlines()
    got = [json.loads(line) for line in got_lines]
    assert len(got) == len(expected) == 5
    for e, g, raw in zip(expected, got, got_lines):
        assert list(g) == ["linex_index", "features"]
        assert raw.startswith('{"linex_index": ')  # default json.dumps separators, as the original
        assert g["linex_index"] == e["linex_index"]
        assert [f["token"] for f in g["features"]] == [f["token"] for f in e["features"]]
        for fe, fg in zip(e["features"], g["features"]):
            assert list(fg) == ["token", "layers"]
            for le, lg in zip(fe["layers"], fg["layers"]):
                assert list(lg) == ["index", "values"] and lg["index"] == le["index"]
                assert max(abs(a - b) for a, b in zip(le["values"], lg["values"])) <= 1e-5


def test_reproduces_the_original_output(tmp_path):
    out = tmp_path / "features.jsonl"
    assert main(["extract-features", *_args(out)]) == 0
    _compare(out)
    info = json.loads((tmp_path / "features.jsonl.args.json").read_text())
    assert info["command"] == "extract-features" and info["args"]["output_file"] == str(out)


def test_space_separated_flags_and_module_entry_point(tmp_path):
    out = tmp_path / "f.jsonl"
    argv = [a for arg in _args(out, batch_size=8) for a in arg.split("=", 1)]
    result = subprocess.run([sys.executable, "-m", "bert", "extract-features", *argv], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    _compare(out)


def test_builtin_demo_runs_with_defaults(tmp_path):
    out = tmp_path / "demo.jsonl"
    assert main(["extract-features", f"--output_file={out}", "--layers=-1,-2", "--max_seq_length=24"]) == 0
    _compare(out)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"input_file": "nope.txt"}, "input file nope.txt does not exist"),
        ({"max_seq_length": 65}, "--max_seq_length=65 must be between 3 and max_position_embeddings=64 (the model's)"),
        ({"layers": "-3"}, "layer -3 does not exist in a 2-layer model"),
        ({"layers": "a,b"}, "must be comma-separated integers"),
        ({"init_checkpoint": "missing/bert_model.ckpt"}, "missing"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, change, fragment):
    out = tmp_path / "f.jsonl"
    assert main(["extract-features", *_args(out, **change)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
    assert not out.exists()


def test_vocab_larger_than_config_is_refused(tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text((CKPT / "vocab.txt").read_text() + "extra1\nextra2\n")
    out = tmp_path / "f.jsonl"
    assert main(["extract-features", *_args(out, vocab_file=vocab)]) == 2
    assert "has 101 entries but the config's vocab_size is 99" in capsys.readouterr().err
    assert not out.exists()
