"""A model fine-tuned with `bert classify --long_document=windows --window_pooling=max` on texts and pairs
longer than one window (the second text of a pair longer than a window too): `bert predict` and `bert serve`
read the saved window settings from config.json and give exactly `bert classify --do_predict`'s
test_results.tsv; a flag on the command line overrides a saved setting and says so."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bert.cli import main
from bert.commands.classify import ClassifyArgs, run_classify
from bert.tokenization import FullTokenizer
from conftest import args_for, shared_path

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")

from test_serve import call, free_port  # noqa: E402

MAX_SEQ_LENGTH = 16
DOC_STRIDE = 5
START_TIMEOUT = 90  # seconds for the server process to answer /health on a busy 2-core machine


def mrpc_records(name: str, n: int) -> list[dict]:
    """The first `n` rows of MRPC's `name`.tsv, alternately a pair and both sentences joined as one text."""
    lines = (shared_path("data", "glue", "MRPC") / f"{name}.tsv").read_text(encoding="utf-8-sig").splitlines()
    records = []
    for i, line in enumerate(lines[1 : n + 1]):
        label, _, _, a, b = line.split("\t")
        pair = {"text": a, "text_pair": b} if i % 2 == 0 else {"text": f"{a} {b}", "text_pair": None}
        records.append({**pair, "label": label if name == "train" else "0"})
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(model_files, tmp_path_factory) -> tuple[Path, list[dict], list[str]]:
    """(model directory, test records, test_results.tsv lines) of a windows + max pooling classifier."""
    d = tmp_path_factory.mktemp("windows")
    write_jsonl(d / "train.jsonl", mrpc_records("train", 32))
    test = mrpc_records("test", 16)
    write_jsonl(d / "test.jsonl", test)
    out = d / "out"
    run_classify(
        args_for(
            ClassifyArgs,
            model_files,
            out,
            task_name="generic",
            data_dir=str(d),
            train_file="train.jsonl",
            test_file="test.jsonl",
            text_a_column="text",
            text_b_column="text_pair",
            label_column="label",
            long_document="windows",
            window_pooling="max",
            doc_stride=DOC_STRIDE,
            max_seq_length=MAX_SEQ_LENGTH,
            do_train=True,
            do_predict=True,
            train_batch_size=8,
            num_train_epochs=1.0,
            learning_rate=1e-3,
        )
    )
    # Fine-tuning saves how the model reads long documents; predict and serve find it there.
    saved = json.loads((out / "model" / "config.json").read_text())
    assert (saved["long_document"], saved["doc_stride"], saved["window_pooling"]) == ("windows", DOC_STRIDE, "max")
    assert saved["max_seq_length"] == MAX_SEQ_LENGTH
    tokenizer = FullTokenizer(out / "model" / "vocab.txt", do_lower_case=True)
    pairs = [r for r in test if r["text_pair"]]
    assert sum(len(tokenizer.tokenize(r["text_pair"])) > MAX_SEQ_LENGTH for r in pairs) >= 6
    assert sum(len(tokenizer.tokenize(r["text"])) > MAX_SEQ_LENGTH for r in test) >= 12
    return out / "model", test, (out / "test_results.tsv").read_text().splitlines()


def predicted_rows(path: Path, labels: list[str]) -> list[str]:
    """`bert predict --top_k=0` output as test_results.tsv lines (label-list order, float32 `str`)."""
    rows = []
    for line in path.read_text().splitlines():
        scores = {s["label"]: s["score"] for s in json.loads(line)["scores"]}
        rows.append("\t".join(str(np.float32(scores[label])) for label in labels))
    return rows


def test_predict_reads_the_saved_windows(trained, tmp_path, caplog):
    model, test, expected = trained
    inputs = write_jsonl(tmp_path / "in.jsonl", test)

    def predict(out: Path, *flags: str) -> list[str]:
        argv = [f"--model={model}", f"--input_file={inputs}", f"--output_file={out}", "--top_k=0", *flags]
        assert main(["predict", *argv]) == 0
        return predicted_rows(out, ["0", "1"])

    assert predict(tmp_path / "p.jsonl") == expected
    # Each window setting given on the command line overrides the saved one, and says so.
    with caplog.at_level(logging.WARNING, logger="bert"):
        for flag, value in (("long_document", "truncate"), ("window_pooling", "mean"), ("doc_stride", "3")):
            caplog.clear()
            assert predict(tmp_path / f"{flag}.jsonl", f"--{flag}={value}") != expected, flag
            assert f"{flag}={value} from the command line overrides the model's" in caplog.text


def test_serve_reads_the_saved_windows(trained, tmp_path):
    model, test, expected = trained
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "bert", "serve", f"--model={model}", f"--port={port}", "--threads=1"]
    with open(log, "w") as f:
        server = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert server.poll() is None, f"the server exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no /health after {START_TIMEOUT} s: {log.read_text()[-3000:]}"
            try:
                if call(port, "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        inputs = [[r["text"], r["text_pair"]] if r["text_pair"] else [r["text"]] for r in test]
        status, _, batch = call(port, "/predict", {"inputs": inputs})
        assert status == 200, batch
        rows = []
        for scores in batch:
            by_label = {s["label"]: s["score"] for s in scores}
            rows.append("\t".join(str(np.float32(by_label[label])) for label in ("0", "1")))
        assert rows == expected
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            assert server.wait(60) == 0, log.read_text()[-3000:]
        except subprocess.TimeoutExpired:
            server.kill()
            raise
