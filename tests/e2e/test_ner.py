"""`bert ner` end to end on a tiny random model and a CoNLL-2003 slice: the output files, entity F1
recomputed from the written predictions equal to eval_results.txt, and bad CoNLL input (exit 2, one
line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.ner import NerArgs, run_ner
from bert.metrics import ner_metrics
from bert.tasks.common import pad_2d
from bert.tasks.ner import (
    CONLL2003_LABELS,
    IGNORE_INDEX,
    convert_ner_examples_to_features,
    read_conll,
    read_prediction_file,
    word_predictions,
)
from bert.tokenization import FullTokenizer
from conftest import (
    args_for,
    check_curves,
    cli_error,
    model_flags,
    read_results,
    shared_path,
)

TINY_MODEL = dict(vocab="cased.txt", do_lower_case=False)  # conftest's model_files


def conll_slice(dst: Path, sentences: int) -> Path:
    """The first `sentences` sentences (and the -DOCSTART- lines before them) of each CoNLL-2003 file."""
    src = shared_path("data", "conll2003")
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("train.txt", "valid.txt", "test.txt"):
        out, count, in_sentence = [], 0, False
        for line in (src / name).read_text(encoding="utf-8").splitlines(keepends=True):
            if not line.strip():
                count += in_sentence
                in_sentence = False
                if count >= sentences:
                    break
            elif not line.startswith("-DOCSTART-"):
                in_sentence = True
            out.append(line)
        (dst / name).write_text("".join(out) + "\n", encoding="utf-8")
    return dst


def ner_args(model_files, data_dir, output_dir, **flags) -> NerArgs:
    return args_for(NerArgs, model_files, output_dir, **{"data_dir": str(data_dir), "do_lower_case": False, **flags})


def test_ner_on_a_conll2003_slice(model_files, tmp_path):
    data = conll_slice(tmp_path / "data", 200)
    assert len(read_conll(data / "train.txt")) == 200
    out = tmp_path / "out"
    result = run_ner(
        ner_args(
            model_files,
            data,
            out,
            do_train=True,
            do_eval=True,
            do_predict=True,
            max_seq_length=64,
            train_batch_size=16,
            eval_batch_size=32,
            predict_batch_size=32,
            num_train_epochs=1.0,
            learning_rate=1e-3,
        )
    )
    assert result["global_step"] == int(200 / 16 * 1.0)  # 12: sentences / batch x epochs
    results = read_results(out / "eval_results.txt")
    assert set(results) == {
        "eval_accuracy",
        "eval_f1",
        "eval_loss",
        "eval_precision",
        "eval_recall",
        "global_step",
        "loss",
    }
    assert results["global_step"] == "12"

    # The written dev predictions and eval_loss are those of the model saved in model/: recompute them from
    # its logits (one sentence at a time, unpadded). eval_loss is the mean over every labelled word piece.
    from bert.modeling import BertForTokenClassification

    model = BertForTokenClassification.from_pretrained(out / "model").eval()
    assert model.num_labels == 9 and model.config.extra["id2label"]["0"] == "O"
    dev = read_conll(data / "valid.txt")
    tokenizer = FullTokenizer(out / "model" / "vocab.txt", do_lower_case=False)
    features = convert_ner_examples_to_features(dev, CONLL2003_LABELS, 64, tokenizer, pad=False)
    with torch.no_grad():
        logits = [model(torch.tensor([f.input_ids]), None, torch.tensor([f.segment_ids])).logits[0] for f in features]
    losses = []
    for f, row in zip(features, logits):
        labels = torch.tensor(f.label_ids)
        losses += torch.nn.functional.cross_entropy(row.double(), labels, reduction="none")[labels != IGNORE_INDEX]
    assert float(results["eval_loss"]) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-4)
    argmax = pad_2d([row.argmax(-1).tolist() for row in logits])
    gold, pred = read_prediction_file(out / "eval_predictions.txt")
    assert gold == [ex.labels for ex in dev]
    assert pred == word_predictions(dev, features, argmax, CONLL2003_LABELS)
    assert {"eval_loss", "eval_f1", "eval_accuracy"} <= set(check_curves(out)["runs"][0]["eval"])

    # Entity scores recomputed from the written dev predictions equal eval_results.txt.
    scores = ner_metrics(gold, pred)
    for key in ("f1", "precision", "recall", "accuracy"):
        assert results[f"eval_{key}"] == str(np.float32(scores[key])), key

    # test_predictions.txt: `token gold pred`, one line per word, a blank line after each sentence.
    test = read_conll(data / "test.txt")
    lines = (out / "test_predictions.txt").read_text(encoding="utf-8").split("\n")
    words = [line.split() for line in lines if line]
    assert len(words) == sum(len(ex.words) for ex in test)
    assert [w[0] for w in words] == [w for ex in test for w in ex.words]
    assert [w[1] for w in words] == [label for ex in test for label in ex.labels]
    assert {w[2] for w in words} <= set(json.loads((out / "model" / "config.json").read_text())["label2id"])
    gold, pred = read_prediction_file(out / "test_predictions.txt")
    assert read_results(out / "test_results.txt")["test_f1"] == str(np.float32(ner_metrics(gold, pred)["f1"]))


def test_bad_conll_input_fails_before_writing(model_files, tmp_path, capsys):
    out = tmp_path / "out"
    common = [*model_flags(model_files, out), "--do_lower_case=false"]
    good = "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
    cases = {
        "wrong number of columns": (good + "German JJ B-MISC\ncall NN I-NP O\n", "train.txt:4: expected 4"),
        "label not in the list": (good + "German JJ B-NP B-FOO\n", "label 'B-FOO'"),
        "empty file": ("", "holds no sentences"),
    }
    for name, (text, expected) in cases.items():
        data = tmp_path / name.replace(" ", "_")
        data.mkdir()
        (data / "train.txt").write_text(text, encoding="utf-8")
        err = cli_error(capsys, "ner", "--do_train", f"--data_dir={data}", *common)
        assert expected in err, (name, err)
        assert not out.exists(), f"{name}: {out} was written"
    err = cli_error(capsys, "ner", f"--data_dir={tmp_path}", *common)
    assert "do_train" in err and not out.exists()
