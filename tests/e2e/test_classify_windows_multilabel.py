"""`bert classify` on long documents (`--long_document=windows`) and multi-label data (`--multi_label`), end to
end on a tiny random model: one result line per example from the pooled windows, the exported config's
inference settings, a multi-label model that learns keyword labels better than the trivial baselines, tuned
thresholds saved and reused, transformers reading the exported model, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.classify import ClassifyArgs, run_classify
from bert.modeling import BertForSequenceClassification
from bert.tasks.common import sigmoid, softmax
from bert.tasks.generic import GenericProcessor
from bert.tasks.glue import Sst2Processor
from bert.tasks.windows import convert_examples_to_windows
from bert.tokenization import FullTokenizer
from conftest import cli_error, save_tiny_model, shared_path

ORIGINAL_KEYS = {"eval_accuracy", "eval_loss", "global_step", "loss"}
MULTI_LABEL_KEYS = {
    "eval_micro_f1",
    "eval_micro_precision",
    "eval_micro_recall",
    "eval_macro_f1",
    "eval_macro_precision",
    "eval_macro_recall",
    "eval_subset_accuracy",
    "eval_loss",
    "global_step",
    "loss",
}
# Labels of real SST-2 sentences, from the words they contain.
KEYWORDS = {"film": {"film", "movie"}, "good": {"good", "great", "best"}, "story": {"story", "plot", "characters"}}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), shared_path("data", "vocab", "uncased.txt"), True)


def args_for(model_files, data_dir, output_dir, **kw) -> ClassifyArgs:
    config, vocab, init = model_files
    base = dict(
        data_dir=str(data_dir),
        output_dir=str(output_dir),
        vocab_file=str(vocab),
        bert_config_file=str(config),
        init_checkpoint=str(init),
        device="cpu",
    )
    return ClassifyArgs(**{**base, **kw})


def read_results(path: Path) -> dict[str, str]:
    return dict(line.split(" = ") for line in path.read_text().splitlines())


def read_tsv(path: Path) -> np.ndarray:
    return np.array([[float(x) for x in line.split("\t")] for line in path.read_text().splitlines()])


def model_logits(model_dir: Path, features) -> np.ndarray:
    """[F, L] the exported model's logits of `features`, one at a time, unpadded."""
    model = BertForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return np.stack(
            [
                model(torch.tensor([f.input_ids]), None, torch.tensor([f.segment_ids])).logits[0].numpy()
                for f in features
            ]
        )


# --------------------------------------------------------------------------------------------------
# Long documents


def test_windows_train_evaluate_and_predict_one_line_per_example(model_files, tmp_path):
    """SST-2 rows at max_seq_length 16: most sentences are longer and become several windows; the results keep
    one line per example, equal to the exported model's window logits pooled by mean (and, in a second
    evaluation, by max)."""
    src, data = shared_path("data", "glue", "SST-2"), tmp_path / "data"
    data.mkdir()
    for name, n in (("train", 32), ("dev", 16), ("test", 12)):
        lines = (src / f"{name}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        (data / f"{name}.tsv").write_text("".join(lines[: n + 1]), encoding="utf-8")
    out = tmp_path / "out"
    flags = dict(task_name="SST-2", max_seq_length=16, long_document="windows", doc_stride=6)
    run_classify(
        args_for(
            model_files,
            data,
            out,
            do_train=True,
            do_eval=True,
            do_predict=True,
            train_batch_size=8,
            num_train_epochs=1.0,
            learning_rate=1e-3,
            **flags,
        )
    )
    results = read_results(out / "eval_results.txt")
    assert set(results) == ORIGINAL_KEYS and results["global_step"] == "4"
    # One prediction per dev example: the accuracy is a multiple of 1/16.
    assert float(results["eval_accuracy"]) * 16 == pytest.approx(round(float(results["eval_accuracy"]) * 16), abs=1e-4)
    saved = json.loads((out / "model" / "config.json").read_text())
    assert (saved["long_document"], saved["doc_stride"], saved["window_pooling"]) == ("windows", 6, "mean")

    tok = FullTokenizer(out / "model" / "vocab.txt", do_lower_case=True)
    examples = Sst2Processor().get_test_examples(data)
    windows = convert_examples_to_windows(examples, ["0", "1"], 16, tok, doc_stride=6, pad=False)
    owners = np.array([f.example_index for f in windows])
    assert len(windows) > 2 * len(examples) and np.bincount(owners).min() >= 1
    logits = model_logits(out / "model", windows)
    mean = np.stack([logits[owners == i].mean(0) for i in range(len(examples))])
    probs = read_tsv(out / "test_results.tsv")
    assert probs.shape == (12, 2)
    np.testing.assert_allclose(probs, softmax(mean), atol=1e-5)

    run_classify(args_for(model_files, data, out, do_eval=True, do_predict=True, window_pooling="max", **flags))
    top = np.stack([logits[owners == i].max(0) for i in range(len(examples))])
    np.testing.assert_allclose(read_tsv(out / "test_results.tsv"), softmax(top), atol=1e-5)
    assert read_results(out / "eval_results.txt")["global_step"] == "4"


# --------------------------------------------------------------------------------------------------
# Multi-label


def keyword_dataset(directory: Path, sizes: dict[str, int]) -> Path:
    """Real SST-2 sentences with 1-3 of the KEYWORDS labels, comma separated in the last column."""
    rows = []
    for line in (shared_path("data", "glue", "SST-2") / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        sentence = line.split("\t")[0].strip()
        labels = [name for name, words in KEYWORDS.items() if words & set(sentence.split())]
        if labels and 6 <= len(sentence.split()) <= 24:
            rows.append(f"{sentence}\t{','.join(labels)}\n")
    directory.mkdir()
    start = 0
    for name, n in sizes.items():
        (directory / f"{name}.tsv").write_text("".join(rows[start : start + n]), encoding="utf-8")
        start += n
    return directory


def test_multi_label_learns_keyword_labels(model_files, tmp_path):
    data = keyword_dataset(tmp_path / "data", {"train": 384, "dev": 64, "test": 32})
    out = tmp_path / "out"
    flags = dict(task_name="generic", multi_label=True, max_seq_length=32)
    result = run_classify(
        args_for(
            model_files,
            data,
            out,
            do_train=True,
            do_eval=True,
            do_predict=True,
            train_batch_size=16,
            num_train_epochs=3.0,
            learning_rate=2e-3,
            tune_thresholds=True,
            **flags,
        )
    )
    results = read_results(out / "eval_results.txt")
    assert set(results) == MULTI_LABEL_KEYS | {"eval_tuned_micro_f1", "eval_tuned_macro_f1"}
    dev = GenericProcessor(multi_label=True, label_list=list(KEYWORDS)).get_dev_examples(data)
    gold = np.array([[name in ex.label for name in KEYWORDS] for ex in dev])
    # The trivial baselines: no label (micro F1 0) and every label (precision = the share of positives).
    every_label = 2 * gold.sum() / (gold.size + gold.sum())
    assert result["eval"]["eval_micro_f1"] > max(0.0, every_label) + 0.1, (result["eval"], every_label)

    # The exported config: what transformers and `bert predict` read.
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["problem_type"] == "multi_label_classification"
    assert saved["id2label"] == {"0": "film", "1": "good", "2": "story"}  # the sorted union
    assert saved["label2id"] == {"film": 0, "good": 1, "story": 2}
    scores = [line.split("\t") for line in (out / "eval_label_scores.tsv").read_text().splitlines()]
    assert scores[0] == ["label", "threshold", "precision", "recall", "f1", "support"]
    assert [s[0] for s in scores[1:]] == ["film", "good", "story"]
    assert [int(s[5]) for s in scores[1:]] == gold.sum(0).tolist()
    thresholds = saved["label_thresholds"]
    assert set(thresholds) == {"film", "good", "story"} and thresholds != dict.fromkeys(thresholds, 0.5)  # tuned
    assert [float(s[1]) for s in scores[1:]] == pytest.approx(list(thresholds.values()), abs=1e-5)

    # test_results.tsv: the sigmoid of the model's logits, one line per example; the predicted label sets
    # are those at or above the tuned thresholds.
    tok = FullTokenizer(out / "model" / "vocab.txt", do_lower_case=True)
    test = GenericProcessor(multi_label=True, label_list=list(KEYWORDS)).get_test_examples(data)
    features = convert_examples_to_windows(test, list(KEYWORDS), 32, tok, doc_stride=128, pad=False)
    assert len(features) == len(test)  # short sentences: one window each, the truncate features
    probs = read_tsv(out / "test_results.tsv")
    assert probs.shape == (32, 3)
    np.testing.assert_allclose(probs, sigmoid(model_logits(out / "model", features)), atol=1e-5)
    limits = np.array([thresholds[name] for name in KEYWORDS])
    predicted = (out / "test_predicted_labels.tsv").read_text().split("\n")[:-1]
    assert predicted == [",".join(n for n, on in zip(KEYWORDS, row) if on) for row in probs >= limits]

    # Evaluation alone uses the thresholds saved with the model: its micro F1 is the tuned one.
    again = run_classify(args_for(model_files, data, out, do_eval=True, **flags))
    assert again["eval"]["eval_micro_f1"] == pytest.approx(result["eval"]["eval_tuned_micro_f1"])


def test_transformers_reads_the_exported_multi_label_model(model_files, tmp_path):
    """transformers' AutoModelForSequenceClassification loads the exported model with its problem type and
    label names, gives the same logits, and its loss (BCEWithLogitsLoss) equals the head's."""
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
    data = keyword_dataset(tmp_path / "data", {"train": 32, "dev": 8})
    out = tmp_path / "out"
    run_classify(
        args_for(
            model_files,
            data,
            out,
            task_name="generic",
            multi_label=True,
            do_train=True,
            train_batch_size=16,
            num_train_epochs=1.0,
        )
    )
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    assert hf.config.problem_type == "multi_label_classification"
    assert hf.config.id2label == {0: "film", 1: "good", 2: "story"}
    ours = BertForSequenceClassification.from_pretrained(out / "model").eval()
    assert ours.problem_type == "multi_label_classification"
    ids = torch.tensor([[101, 2023, 3185, 2003, 2204, 102], [101, 1996, 2466, 102, 0, 0]])
    mask = (ids > 0).long()
    labels = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    with torch.no_grad():
        theirs, mine = hf(input_ids=ids, attention_mask=mask, labels=labels), ours(ids, mask, labels=labels)
    torch.testing.assert_close(mine.logits, theirs.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(mine.loss, theirs.loss, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Bad input


def test_bad_multi_label_and_window_input(model_files, tmp_path, capsys):
    config, vocab, init = model_files
    out = tmp_path / "out"
    data = keyword_dataset(tmp_path / "data", {"train": 16, "dev": 8})
    common = [f"--vocab_file={vocab}", f"--bert_config_file={config}", f"--init_checkpoint={init}"]
    common += [f"--output_dir={out}", "--device=cpu"]
    generic = ["--task_name=generic", "--multi_label", f"--data_dir={data}"]
    sst2 = ["--task_name=SST-2", f"--data_dir={data}"]

    def data_with(name: str, text: str) -> str:
        d = tmp_path / f"data-{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for f in data.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        (d / name).write_text(text, encoding="utf-8")
        return f"--data_dir={d}"

    cases = {
        "not generic": ([*sst2, "--multi_label", "--do_train"], "only apply to --task_name=generic"),
        "separator without multi_label": (
            [*sst2[1:], "--task_name=generic", "--label_separator=|", "--do_train"],
            "--multi_label",
        ),
        "regression": ([*generic, "--is_regression", "--do_train"], "either multi-label or regression"),
        "threshold": ([*generic, "--threshold=1.5", "--do_train"], "--threshold=1.5 must be a probability"),
        "tune without eval": ([*generic, "--tune_thresholds", "--do_train"], "add --do_eval"),
        "unknown dev label": (
            [*generic[:2], "--do_train", "--do_eval", data_with("dev.tsv", "a b\tfilm,fun\n")],
            "'fun'",
        ),
        "empty label set": (
            [*generic[:2], "--do_train", data_with("train.tsv", "a b\tfilm\nc d\t\n")],
            "train.tsv:2: no label",
        ),
        "long_document": ([*sst2, "--long_document=split", "--do_train"], "truncate, windows"),
        "window_pooling": ([*sst2, "--window_pooling=sum", "--do_train"], "mean, max"),
        "doc_stride": ([*sst2, "--doc_stride=0", "--do_train"], "--doc_stride=0"),
    }
    for name, (argv, expected) in cases.items():
        err = cli_error(capsys, "classify", *common, *argv)
        assert expected in err, (name, err)
        assert not out.exists(), f"{name}: {out} was written"
