"""The output guard on every command that writes, and what a killed or concurrent run leaves.

- `test_every_output_flag_is_claimed`: walks `cli.COMMANDS`; each command with an output flag, given an
  output that is one of its inputs (or of the wrong kind), stops with one line before any work and leaves
  the input byte for byte unchanged. A new command with an output flag and no case here fails the test.
- `test_output_that_is_part_of_the_model`: `--output_file=MODEL/vocab.txt`, `--output=MODEL/model.safetensors`,
  `bert export` into the model directory, `bert convert --input=DIR/model.safetensors --output=DIR`.
- `test_output_that_is_a_fifo`: a FIFO as the output of predict, embed, fill-mask, build-vocab, export.
- `test_second_run_on_the_same_output`: embed, build-vocab and export on an output another process holds.
- `test_leftovers_of_a_killed_run_are_removed`: the temporary names a killed predict/embed/build-vocab/export
  leaves beside its output are gone after the next run.
- `test_kill_during_export_is_cleaned_up`: a real SIGKILL inside `bert export`; the rerun removes its
  `.model.pt.tmp-*` directory.
- `test_gzip_input_cut_short_or_not_gzip`: a truncated .gz, a .gz that is plain text -> one line naming the file.
- `test_deeply_nested_json_line`: a JSON line nested 100,000 deep -> one line naming the file and line.
- `test_undecodable_byte_after_a_bom_names_its_line`: a bad byte on line 7 of a BOM-prefixed TSV is line 7.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bert import cli, outputs
from bert.cli import main as cli_main
from bert.errors import InputError
from bert.modeling import BertForSequenceClassification
from conftest import REPO, cli_error, save_model_dir, save_tiny_model, uncased_vocab, vocab_config

# The flags through which a command writes (its Args field names).
OUTPUT_FIELDS = ("output_file", "output", "output_dir", "out_file")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{"config", "vocab", "pretrained", "classifier"}: a tiny pre-training model and a 2-label classifier."""
    d = tmp_path_factory.mktemp("models")
    config, vocab, pretrained = save_tiny_model(d, uncased_vocab(d), True)
    torch.manual_seed(0)
    classifier = BertForSequenceClassification(vocab_config(vocab), num_labels=2)
    save_model_dir(classifier, d / "classifier", vocab, label_list=["neg", "pos"])
    return {"config": config, "vocab": vocab, "pretrained": pretrained, "classifier": d / "classifier"}


def _text(path: Path) -> Path:
    path.write_text("the cat sat on the [MASK] .\na good [MASK] .\n" * 4, encoding="utf-8")
    return path


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": path.read_bytes()}


# command -> (argv, the input the output collides with, the words the one line must hold)
def _cases(tmp: Path, m: dict) -> dict[str, tuple[list[str], Path, str]]:
    text = _text(tmp / "text.txt")
    model = [f"--vocab_file={m['vocab']}", f"--bert_config_file={m['config']}", f"--init_checkpoint={m['pretrained']}"]
    data = tmp / "data"
    data.mkdir()
    (data / "train.tsv").write_text("a good day .\t1\na bad day .\t0\n", encoding="utf-8")
    run = tmp / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    (run / "eval_results.json").write_text("{}")
    squad = tmp / "dev.json"
    squad.write_text(json.dumps({"version": "1.1", "data": []}))
    preds = tmp / "preds.json"
    preds.write_text("{}")
    not_a_dir = tmp / "a-file"
    not_a_dir.write_text("keep me")
    train = ["--do_train", "--device=cpu"]
    return {
        "quickstart": ([f"--output_dir={not_a_dir}"], not_a_dir, "is a file"),
        "tokenize": ([f"--vocab_file={m['vocab']}", f"--input_file={text}", f"--output_file={text}"], text, "is also"),
        "build-vocab": ([f"--input_file={text}", f"--output_file={text}"], text, "is also --input_file"),
        "create-pretraining-data": (
            [
                f"--input_file={text}",
                f"--output_file={m['vocab']}",
                f"--vocab_file={m['vocab']}",
                "--output_format=tfrecord",
            ],
            m["vocab"],
            "is also --vocab_file",
        ),
        "prepare-corpus": ([f"--input_file={text}", f"--output_file={text}"], text, "is also --input_file"),
        "pretrain": (
            [f"--input_file={text}", f"--output_dir={m['pretrained']}", *model, *train],
            m["pretrained"],
            "is also --init_checkpoint",
        ),  # fmt: skip
        "classify": (
            ["--task_name=generic", f"--data_dir={data}", f"--output_dir={data}", *model, *train],
            data,
            "is also --data_dir",
        ),  # fmt: skip
        "ner": ([f"--data_dir={data}", f"--output_dir={data}", *model, *train], data, "is also --data_dir"),
        "swag": ([f"--data_dir={data}", f"--output_dir={data}", *model, *train], data, "is also --data_dir"),
        "squad": (
            [f"--output_dir={m['pretrained']}", f"--train_file={squad}", *model, *train],
            m["pretrained"],
            "is also --init_checkpoint",
        ),  # fmt: skip
        "train-embeddings": (
            [f"--train_file={text}", f"--output_dir={m['pretrained']}", *model, *train],
            m["pretrained"],
            "is also --init_checkpoint",
        ),  # fmt: skip
        "train-reranker": (
            [f"--train_file={text}", f"--output_dir={m['pretrained']}", *model, *train],
            m["pretrained"],
            "is also --init_checkpoint",
        ),  # fmt: skip
        "extract-features": ([f"--input_file={text}", f"--output_file={text}", *model], text, "is also --input_file"),
        "predict": ([f"--model={m['classifier']}", f"--input_file={text}", f"--output_file={text}"], text, "is also"),
        "embed": ([f"--model={m['pretrained']}", f"--input_file={text}", f"--output_file={text}"], text, "is also"),
        "fill-mask": ([f"--model={m['pretrained']}", f"--input_file={text}", f"--output_file={text}"], text, "is also"),
        "rerank": ([f"--model={m['classifier']}", f"--input_file={text}", f"--output_file={text}"], text, "is also"),
        "search": (
            [f"--model={m['pretrained']}", f"--corpus={text}", f"--queries={text}", f"--output_file={text}"],
            text,
            "is also",
        ),  # fmt: skip
        "index": (
            [f"--corpus_embeddings={text}", f"--output_dir={m['pretrained']}", f"--model={m['pretrained']}"],
            m["pretrained"],
            "is also --model",
        ),  # fmt: skip
        "convert": ([f"--input={m['pretrained']}", f"--output={m['pretrained']}"], m["pretrained"], "is also --input"),
        "export": ([f"--model={m['pretrained']}", f"--output={m['pretrained']}/"], m["pretrained"], "is a file of"),
        "evaluate-squad": ([str(squad), str(preds), f"--out-file={preds}"], preds, "is also"),
        # The series drawn go beside the PNG, as eval_results.json here.
        "plot": ([str(run), f"--output_file={run / 'eval_results.png'}"], run, "is also RUN_DIR"),
    }


def test_every_output_flag_is_claimed(capsys, tmp_path, models):
    cases = _cases(tmp_path, models)
    for name, (module, args_class, _, _) in cli.COMMANDS.items():
        fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), args_class))}
        if not fields & set(OUTPUT_FIELDS):
            continue
        assert name in cases, f"bert {name} writes files: add a case here showing that it claims its outputs"
        argv, victim, words = cases[name]
        before = _snapshot(victim)
        line = cli_error(capsys, name, *argv)
        assert words in line, f"bert {name}: {line}"
        assert _snapshot(victim) == before, f"bert {name} changed {victim}"


def test_output_that_is_part_of_the_model(capsys, tmp_path, models):
    pretrained, classifier = models["pretrained"], models["classifier"]
    text = _text(tmp_path / "in.txt")
    before = _snapshot(pretrained), _snapshot(classifier)
    line = cli_error(capsys, "fill-mask", f"--model={pretrained}", f"--input_file={text}",
                     f"--output_file={pretrained / 'vocab.txt'}")  # fmt: skip
    assert f"is a file of --model={pretrained}" in line, line
    line = cli_error(capsys, "predict", f"--model={classifier}", f"--input_file={text}",
                     f"--output_file={classifier / 'config.json'}")  # fmt: skip
    assert "is a file of --model" in line, line
    for output in (pretrained / "model.safetensors", pretrained / "model.onnx", pretrained):
        line = cli_error(capsys, "export", f"--model={pretrained}", f"--output={output}")
        assert f"is a file of --model={pretrained}" in line, line
    line = cli_error(capsys, "convert", f"--input={classifier / 'model.safetensors'}", f"--output={classifier}")
    assert f"--output={classifier} holds --input={classifier / 'model.safetensors'}" in line, line
    assert (_snapshot(pretrained), _snapshot(classifier)) == before
    # A new file in the model's directory is no harm.
    out = pretrained / "filled.jsonl"
    assert cli_main(["fill-mask", f"--model={pretrained}", f"--input_file={text}", f"--output_file={out}"]) == 0
    assert len(out.read_text().splitlines()) == 8
    out.unlink()


def test_output_that_is_a_fifo(capsys, tmp_path, models):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    text = _text(tmp_path / "in.txt")
    for argv in (
        ["predict", f"--model={models['classifier']}", f"--input_file={text}"],
        ["embed", f"--model={models['pretrained']}", f"--input_file={text}"],
        ["fill-mask", f"--model={models['pretrained']}", f"--input_file={text}"],
        ["build-vocab", f"--input_file={text}"],
    ):
        line = cli_error(capsys, *argv, f"--output_file={fifo}")
        assert f"--output_file={fifo} is not a regular file" in line, line
    line = cli_error(capsys, "export", f"--model={models['pretrained']}", f"--output={fifo}")
    assert "is not a regular file" in line, line
    assert fifo.is_fifo()


HOLD = """
import sys, time
from bert.outputs import claim
with claim("embed", files={"--output_file": sys.argv[1]}):
    print("held", flush=True)
    time.sleep(60)
"""


def test_second_run_on_the_same_output(capsys, tmp_path, models):
    text = _text(tmp_path / "in.txt")
    for out, argv in (
        (tmp_path / "v.npy", ["embed", f"--model={models['pretrained']}", f"--input_file={text}"]),
        (tmp_path / "vocab.txt", ["build-vocab", f"--input_file={text}"]),
        (tmp_path / "m.onnx", ["export", f"--model={models['pretrained']}"]),
    ):
        flag = "--output" if argv[0] == "export" else "--output_file"
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env=_env(), stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            line = cli_error(capsys, *argv, f"{flag}={out}")
            assert f"{flag}={out} is in use by another run (bert embed, pid {holder.pid} on " in line, line
            assert not out.exists()
        finally:
            holder.kill()
            holder.wait()


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if outputs.TEMP_NAME.match(p.name) or p.name.endswith(".lock"))


def test_leftovers_of_a_killed_run_are_removed(tmp_path, models):
    text = _text(tmp_path / "in.txt")
    runs = {
        "p.jsonl": ["predict", f"--model={models['classifier']}", f"--input_file={text}", "--output_file="],
        "v.npy": ["embed", f"--model={models['pretrained']}", f"--input_file={text}", "--output_file="],
        "vocab.txt": ["build-vocab", f"--input_file={text}", "--vocab_size=200", "--output_file="],
        "model.pt": ["export", f"--model={models['pretrained']}", "--format=torchscript", "--output="],
    }
    for name, argv in runs.items():
        out = tmp_path / name
        # What each leaves when killed: an atomic write's file, an export's directory.
        (tmp_path / f".{name}.k1ll3d00.tmp").write_text("half")
        (tmp_path / f".{name}.tmp-k1ll3d00").mkdir()
        assert cli_main([*argv[:-1], argv[-1] + str(out)]) == 0, name
        assert out.is_file() and _leftovers(tmp_path) == [], name


KILL_IN_EXPORT = """
import os, signal, sys
from bert import export
real = export.compare
def compare(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
export.compare = compare
from bert.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_during_export_is_cleaned_up(tmp_path, models):
    argv = ["export", f"--model={models['pretrained']}", "--format=torchscript", f"--output={tmp_path / 'model.pt'}"]
    killed = subprocess.run([sys.executable, "-c", KILL_IN_EXPORT, *argv], env=_env(), capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.pt.tmp-")]
    done = subprocess.run([sys.executable, "-m", "bert", *argv], env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "removed what an interrupted run left" in done.stderr
    assert (tmp_path / "model.pt").is_file() and _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------------ inputs
def test_gzip_input_cut_short_or_not_gzip(capsys, tmp_path, models):
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(b"the cat sat on the mat .\n" * 2000)[:-40])
    not_gzip = tmp_path / "plain.txt.gz"
    not_gzip.write_text("the cat sat on the mat .\n")
    for command in ("embed", "build-vocab"):
        model = [f"--model={models['pretrained']}"] if command == "embed" else []
        out = tmp_path / f"{command}.out"
        line = cli_error(capsys, command, *model, f"--input_file={cut}", f"--output_file={out}")
        assert f"{cut}: cannot read" in line and "cut short" in line, line
        line = cli_error(capsys, command, *model, f"--input_file={not_gzip}", f"--output_file={out}")
        assert f"{not_gzip}: cannot read" in line and "not a gzip file" in line, line
        assert not out.exists()


def test_deeply_nested_json_line(capsys, tmp_path, models):
    text = tmp_path / "in.jsonl"
    text.write_text('{"text": "a good day ."}\n' + '{"text": ' + "[" * 100_000 + "\n")
    line = cli_error(capsys, "predict", f"--model={models['classifier']}", f"--input_file={text}")
    assert f"{text} line 2: JSON nested too deeply" in line, line


def test_undecodable_byte_after_a_bom_names_its_line(tmp_path):
    from bert.tasks.generic import GenericProcessor

    rows = [f"a good day number {i}\tpos" for i in range(10)]
    data = codecs.BOM_UTF8 + "".join(row + "\n" for row in rows).encode()
    cut = data.index(b"number 6")  # line 7
    (tmp_path / "train.tsv").write_bytes(data[:cut] + b"\xff" + data[cut:])
    with pytest.raises(InputError, match=r"train.tsv:7: bytes that are not valid UTF-8 at column 12"):
        GenericProcessor().get_train_examples(tmp_path)
