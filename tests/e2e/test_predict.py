"""`bert predict` end to end on tiny models fine-tuned for a few steps on real rows: the probabilities of
`bert classify --do_predict`'s test_results.tsv, the answers of `bert squad`'s predictions.json over
contexts longer than one window, `bert ner`'s word predictions with entity spans on the raw characters,
multiple choice, and bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bert.commands.classify import ClassifyArgs, run_classify
from bert.commands.ner import NerArgs, run_ner
from bert.commands.predict import PredictArgs, run_predict
from bert.commands.squad import SquadArgs, run_squad
from bert.inference import Predictor
from bert.metrics import iob_chunks
from bert.tasks.ner import read_prediction_file
from conftest import cli_error, save_tiny_model, shared_path, squad_slice


@pytest.fixture(scope="module")
def uncased_model(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), shared_path("data", "vocab", "uncased.txt"), True)


def model_flags(model_files) -> dict:
    config, vocab, init = model_files
    return dict(vocab_file=str(vocab), bert_config_file=str(config), init_checkpoint=str(init), device="cpu")


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ---------------------------------------------------------------------------------------- classification
def test_predict_equals_classify_test_results(uncased_model, tmp_path):
    src = shared_path("data", "glue", "SST-2")
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("".join(open(src / "train.tsv", encoding="utf-8").readlines()[:97]))
    test_lines = open(src / "test.tsv", encoding="utf-8").readlines()[:61]
    (data / "test.tsv").write_text("".join(test_lines))
    out = tmp_path / "out"
    run_classify(
        ClassifyArgs(
            task_name="SST-2",
            data_dir=str(data),
            output_dir=str(out),
            do_train=True,
            do_predict=True,
            train_batch_size=16,
            num_train_epochs=1.0,
            learning_rate=1e-3,
            **model_flags(uncased_model),
        )
    )
    expected = np.array(
        [[float(x) for x in line.split("\t")] for line in (out / "test_results.tsv").read_text().splitlines()]
    )
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(line.split("\t", 1)[1] for line in test_lines[1:]), encoding="utf-8")
    result = run_predict(
        PredictArgs(model=str(out / "model"), input_file=str(sentences), output_file=str(tmp_path / "p.jsonl"), top_k=0)
    )
    assert result == {"lines": 60, "task": "classification", "output_file": str(tmp_path / "p.jsonl")}
    predicted = read_jsonl(tmp_path / "p.jsonl")
    got = np.array([[{s["label"]: s["score"] for s in p["scores"]}[label] for label in ("0", "1")] for p in predicted])
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    assert [p["label"] for p in predicted] == [str(i) for i in expected.argmax(1)]
    # Windows over texts that fit in one give the same answers; the default output has no "scores".
    run_predict(
        PredictArgs(
            model=str(out / "model"),
            input_file=str(sentences),
            output_file=str(tmp_path / "w.jsonl"),
            long_document="windows",
        )
    )
    assert read_jsonl(tmp_path / "w.jsonl") == [{"label": p["label"], "score": p["score"]} for p in predicted]


# ------------------------------------------------------------------------------------- question answering
def test_predict_answers_equal_squad_predictions(tmp_path_factory):
    d = tmp_path_factory.mktemp("squad")
    files = save_tiny_model(d, shared_path("data", "vocab", "uncased.txt"), True, max_position_embeddings=128)
    train = squad_slice("1.1", 0, 16, d / "train.json", training=True)
    predict = squad_slice("1.1", 200, 30, d / "predict.json", training=False)
    out = d / "out"
    windows = dict(max_seq_length=128, max_query_length=32, doc_stride=32)
    run_squad(
        SquadArgs(
            output_dir=str(out),
            train_file=str(train),
            predict_file=str(predict),
            do_train=True,
            do_predict=True,
            train_batch_size=8,
            num_train_epochs=1.0,
            learning_rate=1e-3,
            **windows,
            **model_flags(files),
        )
    )
    expected = json.loads((out / "predictions.json").read_text())
    # The config contract: the fine-tuning length and windows travel with the model.
    config = json.loads((out / "model" / "config.json").read_text())
    assert {k: config.get(k) for k in windows} == windows
    questions = [
        (qa["id"], qa["question"], p["context"])
        for a in json.loads(predict.read_text())["data"]
        for p in a["paragraphs"]
        for qa in p["qas"]
    ]
    lines = d / "questions.jsonl"
    lines.write_text("".join(json.dumps({"question": q, "context": c}) + "\n" for _, q, c in questions))
    run_predict(PredictArgs(model=str(out / "model"), input_file=str(lines), output_file=str(d / "answers.jsonl")))
    answers = read_jsonl(d / "answers.jsonl")
    assert [a["answer"] for a in answers] == [expected[qid] for qid, _, _ in questions]
    tokenizer = Predictor.from_pretrained(out / "model", "cpu").tokenizer
    assert sum(len(tokenizer.tokenize(c)) > 128 - 32 - 3 for _, _, c in questions) >= 10  # several windows
    for (_, _, context), a in zip(questions, answers):
        assert " ".join(context[a["start"] : a["end"]].split()) == a["answer"]
        assert 0 < a["score"] <= 1


# -------------------------------------------------------------------------------------------------- NER
def rig_entities(model_dir: Path, texts: list[str]) -> None:
    """Lower the "O" bias of a barely trained tagger (which tags every word O) by about the median margin of
    "O" over the best other tag on `texts`, so that about half the words get entity tags. The shift is the
    midpoint of the widest gap between neighbouring margins near the median, so that no token is left at a
    tie that float rounding of another batch layout would break either way."""
    import torch
    from safetensors.torch import load_file, save_file

    p = Predictor.from_pretrained(model_dir, "cpu")
    margins = []
    with torch.no_grad():
        for text in texts:
            ids = p.tokenizer.convert_tokens_to_ids(["[CLS]", *p.tokenizer.tokenize(text)[:126], "[SEP]"])
            logits = p.model(torch.tensor([ids])).logits[0]  # [T, L]; label 0 is "O"
            margins.append(logits[:, 0] - logits[:, 1:].max(-1).values)
    weights = load_file(model_dir / "model.safetensors")
    ordered = torch.cat(margins).sort().values
    n = len(ordered)
    k = max(range(n * 2 // 5, n * 3 // 5), key=lambda i: ordered[i] - ordered[i - 1])
    weights["classifier.bias"][0] -= (ordered[k - 1] + ordered[k]) / 2
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})


def test_predict_entities_equal_ner_word_predictions(tmp_path):
    src = shared_path("data", "conll2003")
    files = save_tiny_model(tmp_path, shared_path("data", "vocab", "cased.txt"), False)
    blocks = [b for b in src.joinpath("train.txt").read_text(encoding="utf-8").split("\n\n") if "-DOCSTART-" not in b]
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("\n\n".join(blocks[:100]) + "\n", encoding="utf-8")
    texts = [" ".join(line.split()[0] for line in b.splitlines()) for b in blocks[100:140]]
    texts[0] = "  " + texts[0].replace(" ", "\t", 1) + "  "  # offsets must survive odd whitespace
    out = tmp_path / "out"
    flags = dict(data_dir=str(data), output_dir=str(out), do_lower_case=False, **model_flags(files))
    run_ner(NerArgs(do_train=True, train_batch_size=16, num_train_epochs=1.0, learning_rate=1e-3, **flags))
    rig_entities(out / "model", texts)
    # bert ner reads the words the predictor sees: the BasicTokenizer's, as they appear in the text.
    words = Predictor.from_pretrained(out / "model", "cpu").tag_words(texts)
    conll = "".join("".join(f"{w['word']} O\n" for w in ws) + "\n" for ws in words)
    (data / "test.txt").write_text(conll, encoding="utf-8")
    run_ner(NerArgs(do_predict=True, **flags))
    _, expected = read_prediction_file(out / "test_predictions.txt")
    assert [[w["label"] for w in ws] for ws in words] == expected
    raw = tmp_path / "raw.txt"
    raw.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    run_predict(PredictArgs(model=str(out / "model"), input_file=str(raw), output_file=str(tmp_path / "e.jsonl")))
    predicted = read_jsonl(tmp_path / "e.jsonl")
    assert len(predicted) == len(texts)
    found = 0
    for text, ws, labels, p in zip(texts, words, expected, predicted):
        for w in ws:
            assert text[w["start"] : w["end"]] == w["word"]
        chunks = iob_chunks(labels)
        assert [e["entity"] for e in p["entities"]] == [kind for kind, _, _ in chunks]
        for e, (_, first, last) in zip(p["entities"], chunks):
            assert (e["start"], e["end"]) == (ws[first]["start"], ws[last - 1]["end"])
            assert text[e["start"] : e["end"]] == e["text"] and 0 < e["score"] <= 1
        found += len(chunks)
    assert found >= 5, "the model found too few entities for the check to mean much"


# ------------------------------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def small_models(tmp_path_factory):
    """A pre-trained (BertForPreTraining) model and an untrained multiple-choice one, both tiny."""
    import torch

    from bert.checkpoint import save_pretrained
    from bert.config import BertConfig
    from bert.modeling import BertForMultipleChoice, BertForQuestionAnswering

    d = tmp_path_factory.mktemp("small")
    _, vocab, pretrained = save_tiny_model(d, shared_path("data", "vocab", "uncased.txt"), True)
    config = BertConfig.from_json_file(d / "bert_config.json")
    torch.manual_seed(0)
    save_pretrained(BertForMultipleChoice(config), d / "mc", vocab, do_lower_case=True)
    save_pretrained(BertForQuestionAnswering(config), d / "qa", vocab, do_lower_case=True)
    return {"pretrained": pretrained, "mc": d / "mc", "qa": d / "qa"}


def test_multiple_choice(small_models, tmp_path):
    lines = tmp_path / "in.jsonl"
    items = [
        {"context": "A man sits at a piano.", "endings": ["He plays.", "It rains on the sea.", "Cats."]},
        {"context": "She opens the door", "endings": ["and walks in.", "x"]},
    ]
    lines.write_text("".join(json.dumps(x) + "\n" for x in items))
    run_predict(PredictArgs(model=str(small_models["mc"]), input_file=str(lines), output_file=str(tmp_path / "o")))
    for item, r in zip(items, read_jsonl(tmp_path / "o")):
        assert len(r["scores"]) == len(item["endings"]) and sum(r["scores"]) == pytest.approx(1, abs=1e-6)
        assert r["choice"] == int(np.argmax(r["scores"])) and r["ending"] == item["endings"][r["choice"]]


@pytest.mark.parametrize(
    "model, content, fragment",
    [
        ("pretrained", "a text\n", "is a BertForPreTraining (config.json architectures) without a task head"),
        ("qa", '{"question": "Who?", "context": "Me."}\n\n', "in.txt line 2: empty line; remove it"),
        ("qa", '{"question": "Who?", "context": "Me."}\n{"question": "Why?"}\n', 'line 2: field "context" is missing'),
        ("qa", "Who is it?\n", "line 1: question-answering needs a JSON object per line"),
        ("mc", '{"context": "c", "endings": ["one"]}\n', 'line 1: field "endings" must be a list of at least two'),
        ("mc", '{"context": "c", "endings": ["a", "b"]}\n', "--top_k applies to classification models"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(small_models, tmp_path, capsys, model, content, fragment):
    (tmp_path / "in.txt").write_text(content, encoding="utf-8")
    output = tmp_path / "out.jsonl"
    argv = [f"--model={small_models[model]}", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={output}"]
    if "top_k" in fragment:
        argv.append("--top_k=3")
    line = cli_error(capsys, "predict", *argv)
    assert fragment in line
    assert not output.exists() and not list(tmp_path.glob(".out.jsonl.*"))


def test_stdin_to_stdout(small_models, capsys, monkeypatch):
    import io
    import sys

    from bert.cli import main

    text = json.dumps({"question": "Where is it?", "context": "It is in Paris, France."}) + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))
    assert main(["predict", f"--model={small_models['qa']}"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    answer = json.loads(line)
    assert set(answer) == {"answer", "start", "end", "score"}
    assert "It is in Paris, France."[answer["start"] : answer["end"]] == answer["answer"]


@pytest.mark.parametrize("command, model", [("predict", "qa"), ("fill-mask", "pretrained")])
def test_undecodable_stdin_is_named_stdin(small_models, capsys, monkeypatch, command, model):
    """Bytes that are not UTF-8 on stdin are reported on `<stdin>`'s line, not on the temporary copy's name."""
    import io
    import sys

    good = json.dumps({"question": "Where?", "context": "In [MASK] Paris."}) + "\n"
    raw = good.encode("utf-8") * 2 + b'{"question": "\xff?", "context": "x"}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    line = cli_error(capsys, command, f"--model={small_models[model]}")
    assert "<stdin>:3: bytes that are not valid UTF-8 at column 15 (b'\\xff')" in line, line
    assert "bert-stdin." not in line
