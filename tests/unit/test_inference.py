"""bert.inference: the head chosen from config.json (or the weights), batched results equal to one
forward pass per input and in input order, the config contract (problem types, thresholds, lengths),
windows for long texts, NER spans on the raw characters, answers located in the context, multiple
choice, embeddings equal to transformers' BertModel with the same pooling, fill-mask against a direct
forward pass, sentence-transformers settings, bad input, one call at a time across threads, and CPU
batches side by side, 16 sequences each by default."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.checkpoint import export_tf
from bert.config import BertConfig
from bert.errors import InputError
from bert.flags import CPU_BATCH_SIZE, CPU_BATCH_TOKENS
from bert.inference import Predictor, read_sentence_transformers_config
from bert.inference.core import batch_bounds
from bert.input_lines import InputItemError, read_input_record
from bert.modeling import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bert.tasks.swag import SwagExample, convert_swag_examples_to_features
from conftest import cli_error, save_model_dir, uncased_vocab, vocab_config

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "A much longer sentence, with commas, numbers like 1,234.5 and a few (parenthesised) words in it.",
    "Short one.",
    "naïve café résumé",
]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    return uncased_vocab(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def classifier_dir(vocab, tmp_path_factory):
    torch.manual_seed(1)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=3)
    labels = ["neg", "neutral", "pos"]
    return save_model_dir(
        model,
        tmp_path_factory.mktemp("cls"),
        vocab,
        id2label={str(i): x for i, x in enumerate(labels)},
        label2id={x: i for i, x in enumerate(labels)},
        max_seq_length=24,
    )


def direct_logits(predictor: Predictor, ids: list[int], types: list[int] | None = None) -> torch.Tensor:
    """One unbatched, unpadded forward pass."""
    with torch.no_grad():
        t = torch.tensor([ids])
        return predictor.model(t, torch.ones_like(t), torch.tensor([types or [0] * len(ids)])).logits[0].float()


def encode(predictor: Predictor, a: str, b: str | None = None, limit: int | None = None) -> tuple[list, list]:
    tok = predictor.tokenizer
    ta, tb = tok.tokenize(a), tok.tokenize(b) if b else []
    if limit is not None:
        ta = ta[: limit - 2]
    ids = tok.convert_tokens_to_ids(["[CLS]", *ta, "[SEP]"])
    types = [0] * len(ids)
    if tb:
        ids += tok.convert_tokens_to_ids([*tb, "[SEP]"])
        types += [1] * (len(tb) + 1)
    return ids, types


# ---------------------------------------------------------------------------------------- classification
def test_classify_batched_equals_one_at_a_time_in_input_order(classifier_dir):
    p = Predictor.from_pretrained(classifier_dir, "cpu", batch_size=2)
    assert (p.task, p.labels, p.problem_type, p.max_seq_length) == (
        "classification",
        ["neg", "neutral", "pos"],
        "single_label_classification",
        24,
    )
    inputs = [*SENTENCES, (SENTENCES[1], SENTENCES[3]), (SENTENCES[0], None)]
    results = p.classify(inputs, top_k=0)
    assert len(results) == len(inputs)
    for item, result in zip(inputs, results):
        a, b = (item, None) if isinstance(item, str) else item
        probs = torch.softmax(direct_logits(p, *encode(p, a, b, limit=24)), -1).numpy()
        best = int(probs.argmax())
        assert result["label"] == p.labels[best]
        assert result["score"] == pytest.approx(float(probs[best]), abs=1e-6)
        scores = [s["score"] for s in result["scores"]]
        assert scores == sorted(scores, reverse=True) and len(scores) == 3
        assert sum(scores) == pytest.approx(1.0, abs=1e-5)
    assert "scores" not in p.classify(SENTENCES[:1])[0]
    assert len(p.classify(SENTENCES[:1], top_k=2)[0]["scores"]) == 2


def test_multi_label_thresholds_and_regression(vocab, tmp_path):
    torch.manual_seed(2)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=3)
    labels = ["a", "b", "c"]
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([3.0, 0.0, -3.0]))  # sigmoid ~ 0.95, 0.5, 0.05
    directory = save_model_dir(
        model,
        tmp_path / "ml",
        vocab,
        problem_type="multi_label_classification",
        id2label={str(i): x for i, x in enumerate(labels)},
        label_thresholds={"a": 0.99, "c": 0.01},
    )
    p = Predictor.from_pretrained(directory, "cpu")
    assert p.label_thresholds == {"a": 0.99, "b": 0.5, "c": 0.01}
    for text, result in zip(SENTENCES, p.classify(SENTENCES, top_k=0)):
        sig = torch.sigmoid(direct_logits(p, *encode(p, text))).numpy()
        expected = [x for x, s, t in zip(labels, sig, (0.99, 0.5, 0.01)) if s >= t]
        assert sorted(r["label"] for r in result["labels"]) == sorted(expected)
        assert {r["label"]: r["score"] for r in result["scores"]} == pytest.approx(dict(zip(labels, sig)), abs=1e-6)

    reg = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    p = Predictor.from_pretrained(save_model_dir(reg, tmp_path / "reg", vocab), "cpu")
    assert p.problem_type == "regression"
    result = p.classify(SENTENCES[:2])
    assert set(result[0]) == {"score"}
    assert result[1]["score"] == pytest.approx(float(direct_logits(p, *encode(p, SENTENCES[1]))[0]), abs=1e-5)


def test_long_document_windows(classifier_dir, caplog):
    p = Predictor.from_pretrained(classifier_dir, "cpu")
    assert (p.long_document, p.doc_stride, p.window_pooling) == ("truncate", 128, "mean")  # nothing saved
    short = SENTENCES[0]
    truncated_short = p.classify([short], top_k=0)
    long_text = " ".join(SENTENCES * 3)
    truncated = p.classify([long_text], top_k=0)[0]
    p.set_windows("windows", 10, source="the test")
    assert "long_document=windows from the test overrides the model's truncate" in caplog.text
    # A text that fits one window gets exactly its truncate result.
    assert p.classify([short], top_k=0) == truncated_short
    tokens = p.tokenizer.tokenize(long_text)
    assert len(tokens) > 3 * 22
    ids = p.tokenizer.convert_tokens_to_ids(tokens)
    cls, sep = p.tokenizer.vocab["[CLS]"], p.tokenizer.vocab["[SEP]"]
    windows, start = [], 0
    while True:  # 22 tokens per window (24 minus [CLS] and [SEP]), 10 apart
        windows.append([cls, *ids[start : start + 22], sep])
        if start + 22 >= len(ids):
            break
        start += 10
    logits = torch.stack([direct_logits(p, w) for w in windows])
    result = p.classify([long_text, short], top_k=0)
    probs = torch.softmax(logits.mean(0), -1).numpy()
    assert {s["label"]: s["score"] for s in result[0]["scores"]} == pytest.approx(dict(zip(p.labels, probs)), abs=1e-5)
    assert result[1] == truncated_short[0]
    direct = torch.softmax(direct_logits(p, windows[0]), -1).numpy()
    assert {s["label"]: s["score"] for s in truncated["scores"]} == pytest.approx(dict(zip(p.labels, direct)), abs=1e-5)
    p.set_windows(window_pooling="max")
    top = torch.softmax(logits.max(0).values, -1).numpy()
    result = p.classify([long_text], top_k=0)[0]
    assert {s["label"]: s["score"] for s in result["scores"]} == pytest.approx(dict(zip(p.labels, top)), abs=1e-5)


def test_windows_of_pairs_follow_classification(classifier_dir, tmp_path):
    """A pair whose second text is longer than a window: that text is cut to half the room
    (`bert.tasks.windows.window_spans`) and goes into every window; the settings come from config.json."""
    config = json.loads((classifier_dir / "config.json").read_text())
    model_dir = tmp_path / "windows"
    model_dir.mkdir()
    for f in classifier_dir.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    saved = {"long_document": "windows", "doc_stride": 7, "window_pooling": "max"}
    (model_dir / "config.json").write_text(json.dumps({**config, **saved}))
    p = Predictor.from_pretrained(model_dir, "cpu")
    assert (p.long_document, p.doc_stride, p.window_pooling) == ("windows", 7, "max")
    a, b = " ".join(SENTENCES * 2), " ".join(SENTENCES)
    ids_a, ids_b = p.tokenizer.encode(a), p.tokenizer.encode(b)
    assert len(ids_b) > 24
    cls, sep = p.tokenizer.vocab["[CLS]"], p.tokenizer.vocab["[SEP]"]
    kept = ids_b[: (24 - 3) // 2]  # 10 pieces of text_b, 11 of text_a per window
    logits, start = [], 0
    while True:
        window = [cls, *ids_a[start : start + 11], sep]
        logits.append(direct_logits(p, window + kept + [sep], [0] * len(window) + [1] * (len(kept) + 1)))
        if start + 11 >= len(ids_a):
            break
        start += 7
    [result] = p.classify([(a, b)], top_k=0, raw_scores=True)
    top = torch.stack(logits).max(0).values.numpy()
    assert {s["label"]: s["score"] for s in result["scores"]} == pytest.approx(dict(zip(p.labels, top)), abs=1e-5)
    (model_dir / "config.json").write_text(json.dumps({**config, "window_pooling": "first"}))
    with pytest.raises(InputError, match=r"config.json: window_pooling='first' must be one of mean, max"):
        Predictor.from_pretrained(model_dir, "cpu")


def test_tokenizer_settings_come_from_the_model(vocab, tmp_path):
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=2)
    cased = Predictor.from_pretrained(save_model_dir(model, tmp_path / "cased", vocab, do_lower_case=False), "cpu")
    assert cased.tokenizer.tokenize("Hello") == ["[UNK]"]  # the uncased vocab has no "Hello"
    uncased = Predictor.from_pretrained(save_model_dir(model, tmp_path / "uncased", vocab, do_lower_case=True), "cpu")
    assert uncased.tokenizer.tokenize("Hello") == ["hello"]
    assert Predictor.from_pretrained(tmp_path / "cased", "cpu", do_lower_case=True).tokenizer.tokenize("Hello") == [
        "hello"
    ]


def test_head_comes_from_the_weights_of_a_tf_checkpoint(vocab, tmp_path):
    torch.manual_seed(3)
    model = BertForQuestionAnswering(vocab_config(vocab))
    prefix = export_tf(model, tmp_path / "tf", vocab, do_lower_case=True)
    p = Predictor.from_pretrained(prefix, "cpu")
    assert p.architecture == "BertForQuestionAnswering" and p.max_seq_length == 64  # 384 capped by the positions
    assert torch.equal(p.model.qa_outputs.weight, model.qa_outputs.weight)


# ------------------------------------------------------------------------------------------------- NER
@pytest.fixture(scope="module")
def tagger_dir(vocab, tmp_path_factory):
    model = BertForTokenClassification(vocab_config(vocab), num_labels=3)
    labels = ["O", "B-PER", "I-PER"]
    return model, labels, tmp_path_factory.mktemp("ner"), vocab


def rigged_tagger(tagger_dir, favourite: str) -> Predictor:
    """A tagger that tags every word `favourite` (the head's bias dominates)."""
    model, labels, directory, vocab = tagger_dir
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([10.0 if x == favourite else 0.0 for x in labels]))
    save_model_dir(model, directory / favourite, vocab, id2label={str(i): x for i, x in enumerate(labels)})
    return Predictor.from_pretrained(directory / favourite, "cpu")


def test_ner_spans_are_raw_characters(tagger_dir):
    text = "  John  Smith-Jones,\tof New\u00a0York (N.Y.)  "
    p = rigged_tagger(tagger_dir, "I-PER")  # IOB1: one chunk over every word
    [words] = p.tag_words([text])
    assert [w["word"] for w in words] == [
        "John",
        "Smith",
        "-",
        "Jones",
        ",",
        "of",
        "New",
        "York",
        "(",
        "N",
        ".",
        "Y",
        ".",
        ")",
    ]
    for w in words:
        assert text[w["start"] : w["end"]] == w["word"] and w["label"] == "I-PER"
        assert w["score"] == pytest.approx(np.exp(10) / (np.exp(10) + 2), rel=1e-5)
    [entities] = p.ner([text])
    start, end = text.index("John"), text.index(")") + 1
    assert entities == [
        {
            "entity": "PER",
            "start": start,
            "end": end,
            "text": text[start:end],
            "score": pytest.approx(words[0]["score"]),
        }
    ]
    p = rigged_tagger(tagger_dir, "B-PER")  # every word its own entity
    [entities] = p.ner([text])
    assert [e["text"] for e in entities] == [w["word"] for w in words]
    assert [text[e["start"] : e["end"]] for e in entities] == [e["text"] for e in entities]
    assert rigged_tagger(tagger_dir, "O").ner([text, "x"]) == [[], []]


def test_ner_long_text_is_tagged_in_windows(tagger_dir):
    p = rigged_tagger(tagger_dir, "B-PER")
    text = " ".join(f"w{i}" for i in range(200))  # far more pieces than 64 positions
    [words] = p.tag_words([text])
    assert len(words) == 200 and all(w["label"] == "B-PER" for w in words)


# ------------------------------------------------------------------------------------- question answering
def test_answer_is_located_in_the_context(vocab, tmp_path):
    torch.manual_seed(4)
    model = BertForQuestionAnswering(vocab_config(vocab, max_position_embeddings=48))
    directory = save_model_dir(model, tmp_path / "qa", vocab, doc_stride=8, max_query_length=8)
    p = Predictor.from_pretrained(directory, "cpu")
    assert p.max_seq_length == 48 and p.doc_stride == 8
    context = "  The  Normans (Norman: Nourmands; French: Normands)\n were the people who, in the 10th and 11th " * 4
    questions = ["Who were the Normans?", "When?", "What is French for them?"]
    results = p.answer(questions, [context] * 3)
    for r in results:
        assert r["answer"] and 0 <= r["start"] < r["end"] <= len(context)
        assert " ".join(context[r["start"] : r["end"]].split()) == r["answer"]
        assert 0 < r["score"] <= 1


def test_squad_v2_no_answer(vocab, tmp_path):
    model = BertForQuestionAnswering(vocab_config(vocab))
    with torch.no_grad():  # [CLS] wins: every position but 0 scores the same, the null score is higher
        model.qa_outputs.weight.zero_()
        model.qa_outputs.bias.zero_()
    settings = {"version_2_with_negative": True, "null_score_diff_threshold": -1.0}
    directory = save_model_dir(model, tmp_path / "v2", vocab, **settings)
    p = Predictor.from_pretrained(directory, "cpu")
    [r] = p.answer(["Who?"], ["Nobody was there."])
    assert r["answer"] is None and r["start"] is None and 0 < r["score"] < 1


# ---------------------------------------------------------------------------------------- multiple choice
def test_choose_equals_padded_swag_batches(vocab, tmp_path):
    torch.manual_seed(5)
    model = BertForMultipleChoice(vocab_config(vocab))
    p = Predictor.from_pretrained(save_model_dir(model, tmp_path / "mc", vocab, max_seq_length=20), "cpu")
    contexts = ["A man sits at a piano.", "She opens the door"]
    endings = [["He plays a song.", "He eats the piano whole, slowly.", "It rains."], ["and walks in.", "x"]]
    results = p.choose(contexts, endings)
    for context, ends, result in zip(contexts, endings, results):
        [f] = convert_swag_examples_to_features([SwagExample("0", context, "", ends)], 20, p.tokenizer, pad=True)
        with torch.no_grad():
            logits = p.model(
                torch.tensor([f.input_ids]), torch.tensor([f.input_mask]), torch.tensor([f.segment_ids])
            ).logits[0]
        expected = torch.softmax(logits, -1).tolist()
        assert result["scores"] == pytest.approx(expected, abs=1e-5)
        assert result["choice"] == int(np.argmax(expected)) and result["ending"] == ends[result["choice"]]


# ------------------------------------------------------------------------------------------- embeddings
def test_embeddings_equal_transformers_bert_model(vocab, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(6)
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "enc", vocab)
    p = Predictor.from_pretrained(directory, "cpu", batch_size=2)
    hf = transformers.BertModel.from_pretrained(str(directory)).eval()
    batch = [encode(p, s)[0] for s in SENTENCES]
    T = max(map(len, batch))
    ids = torch.tensor([b + [0] * (T - len(b)) for b in batch])
    mask = (ids != 0).long()
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask)
    hidden, m = out.last_hidden_state, mask[:, :, None].float()
    pooled = {
        "cls": hidden[:, 0],
        "mean": (hidden * m).sum(1) / m.sum(1),
        "max": hidden.masked_fill(m == 0, -1e9).max(1).values,
        "pooler": out.pooler_output,
    }
    for pooling, expected in pooled.items():
        ours = p.embed(SENTENCES, pooling=pooling)
        assert ours.dtype == np.float32 and ours.shape == (len(SENTENCES), 32)
        np.testing.assert_allclose(ours, expected.numpy(), atol=1e-5, rtol=0, err_msg=pooling)
        normalized = torch.nn.functional.normalize(expected, dim=1).numpy()
        np.testing.assert_allclose(p.embed(SENTENCES, pooling=pooling, normalize=True), normalized, atol=1e-5, rtol=0)


def output_widths(monkeypatch) -> list[int]:
    """Each encoder pass's `sequence_output` width from now on (the positions its last block ran at)."""
    widths: list[int] = []
    forward = BertModel.forward

    def spy(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        widths.append(out.sequence_output.shape[1])
        return out

    monkeypatch.setattr(BertModel, "forward", spy)
    return widths


def test_cls_and_pooler_embeddings_run_the_last_block_for_cls_alone(vocab, tmp_path, monkeypatch):
    """The poolings that read [CLS] alone ask the encoder for it alone; the others for every token (the
    vectors' values: the test above)."""
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "enc", vocab)
    p = Predictor.from_pretrained(directory, "cpu")
    widths = output_widths(monkeypatch)
    for pooling in ("cls", "pooler", "mean", "max"):
        widths.clear()
        p.embed(SENTENCES, pooling=pooling)
        assert widths and (set(widths) == {1}) == (pooling in ("cls", "pooler")), pooling


def test_embeddings_are_cut_to_max_seq_length_and_not_normalized_by_default(vocab, tmp_path):
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "enc", vocab)
    p = Predictor.from_pretrained(directory, "cpu", max_seq_length=8)
    long_text = SENTENCES[2]
    [v] = p.embed([long_text], pooling="cls")
    ids = encode(p, long_text, limit=8)[0]
    with torch.no_grad():
        direct = p.model(torch.tensor([ids])).sequence_output[0, 0].numpy()
    np.testing.assert_allclose(v, direct, atol=1e-5)
    assert p.default_pooling == "mean" and not p.default_normalize
    assert abs(float(np.linalg.norm(p.embed(["x"])[0])) - 1) > 1e-3


def test_embedding_windows_are_classification_windows_mean_pooled(vocab, tmp_path):
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "enc", vocab)
    p = Predictor.from_pretrained(directory, "cpu", max_seq_length=12)
    long_text, short = " ".join(SENTENCES), SENTENCES[1]
    ids = p.tokenizer.encode(long_text)
    cls, sep = p.tokenizer.vocab["[CLS]"], p.tokenizer.vocab["[SEP]"]
    windows, start = [], 0
    while True:  # 10 pieces per window (12 minus [CLS] and [SEP]), 4 apart
        windows.append([cls, *ids[start : start + 10], sep])
        if start + 10 >= len(ids):
            break
        start += 4
    assert len(windows) > 5
    for normalize in (False, True):
        each = p.embed(windows, normalize=normalize)  # token-id inputs: each window as given
        expected = each.mean(0)
        if normalize:
            expected /= np.linalg.norm(expected)
        got = p.embed([long_text, short], normalize=normalize, long_document="windows", doc_stride=4)
        np.testing.assert_allclose(got[0], expected, atol=1e-6)
        # A text that fits one window gets its truncate vector.
        np.testing.assert_allclose(got[1], p.embed([short], normalize=normalize)[0], atol=1e-6)
    assert not np.allclose(got[0], p.embed([long_text], normalize=True)[0], atol=1e-3)
    with pytest.raises(InputError, match="a prompt and windows do not go together"):
        p.embed([long_text], prompt="query: ", long_document="windows")
    with pytest.raises(InputError, match="long_document='pages' must be one of truncate, windows"):
        p.embed([long_text], long_document="pages")


def test_sentence_transformers_settings(vocab, tmp_path):
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "st", vocab)
    (directory / "1_Pooling").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    pooling = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 10, "do_lower_case": False}))
    st = read_sentence_transformers_config(directory)
    assert (st.pooling, st.normalize, st.max_seq_length) == ("max", True, 10)
    p = Predictor.from_pretrained(directory, "cpu")
    assert p.max_seq_length == 10
    np.testing.assert_array_equal(p.embed(SENTENCES), p.embed(SENTENCES, pooling="max", normalize=True))
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (directory / "modules.json").write_text(json.dumps(modules))
    p = Predictor.from_pretrained(directory, "cpu")
    with pytest.raises(InputError, match="a Dense module"):
        p.embed(SENTENCES)
    assert p.embed(SENTENCES, pooling="cls").shape == (5, 32)


# -------------------------------------------------------------------------------------------- fill-mask
def test_fill_mask_matches_a_direct_forward_pass(vocab, tmp_path, monkeypatch):
    """The predictions equal the whole model's at the masks, though the encoder's last block runs at the
    masks alone (each batch's widest row's count of them)."""
    torch.manual_seed(7)
    model = BertForPreTraining(vocab_config(vocab)).eval()
    p = Predictor.from_pretrained(save_model_dir(model, tmp_path / "mlm", vocab), "cpu", batch_size=2)
    texts = ["The capital of France is [MASK].", "[MASK] [MASK] went home", "play[MASK] now", "A [MASK]."]
    widths = output_widths(monkeypatch)
    results = p.fill_mask(texts, top_k=4)
    monkeypatch.undo()
    assert sorted(widths) == [1, 2]
    tok = p.tokenizer
    for text, result in zip(texts, results):
        parts = text.split("[MASK]")
        ids, positions = [tok.vocab["[CLS]"]], []
        for j, part in enumerate(parts):
            ids += tok.convert_tokens_to_ids(tok.tokenize(part))
            if j < len(parts) - 1:
                positions.append(len(ids))
                ids.append(tok.vocab["[MASK]"])
        ids.append(tok.vocab["[SEP]"])
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([ids])).mlm_logits[0], -1)  # [T, V] at every position
        assert len(result["masks"]) == len(positions)
        for mask, pos in zip(result["masks"], positions):
            assert text[mask["start"] : mask["end"]] == "[MASK]"
            scores = [x["score"] for x in mask["predictions"]]
            assert len(scores) == 4 and scores == sorted(scores, reverse=True) and sum(scores) <= 1
            top = probs[pos].topk(4)
            assert [x["token_id"] for x in mask["predictions"]] == top.indices.tolist()
            assert scores == pytest.approx(top.values.tolist(), abs=1e-6)
            assert [x["token"] for x in mask["predictions"]] == tok.convert_ids_to_tokens(top.indices.tolist())


def test_fill_mask_whole_words(vocab, tmp_path):
    model = BertForPreTraining(vocab_config(vocab))
    p = Predictor.from_pretrained(save_model_dir(model, tmp_path / "mlm", vocab), "cpu")
    ing = p.tokenizer.vocab["##ing"]
    with torch.no_grad():  # rig the head: "##ing" everywhere
        p.model.cls.predictions.bias.zero_()
        p.model.cls.predictions.bias[ing] = 100.0
    [r] = p.fill_mask(["I like play [MASK] games."], top_k=2)
    top = r["masks"][0]["predictions"][0]
    assert (top["token"], top["word"]) == ("##ing", "playing")
    assert r["sequence"] == "I like playing games."


# ------------------------------------------------------------------------------------------- bad input
def test_bad_input(vocab, tmp_path, classifier_dir):
    pretrained = save_model_dir(BertForPreTraining(vocab_config(vocab)), tmp_path / "pt", vocab)
    p = Predictor.from_pretrained(pretrained, "cpu")
    with pytest.raises(InputError, match="without a classification head; fine-tune it with `bert classify`"):
        p.classify(["x"])
    with pytest.raises(InputItemError, match=r"input 1: no \[MASK\]") as e:
        p.fill_mask(["a [MASK]", "b"])
    assert e.value.index == 1
    with pytest.raises(InputItemError, match="more than max_seq_length=64"):
        p.fill_mask(["word " * 70 + "[MASK]"])
    encoder = Predictor.from_pretrained(save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "enc", vocab), "cpu")
    with pytest.raises(InputError, match="without a fill-mask head"):
        encoder.fill_mask(["a [MASK]"])
    c = Predictor.from_pretrained(classifier_dir, "cpu")
    with pytest.raises(InputItemError, match="input 2: the text must be a non-empty string"):
        c.classify(["a", "b", "  "])
    with pytest.raises(InputError, match="the test: doc_stride must be a positive integer, got 0"):
        c.set_windows(doc_stride=0, source="the test")
    with pytest.raises(InputError, match="max_seq_length=100 must be between 3 and max_position_embeddings=64"):
        Predictor.from_pretrained(classifier_dir, "cpu", max_seq_length=100)
    config = json.loads((tmp_path / "enc" / "config.json").read_text())
    (tmp_path / "enc" / "config.json").write_text(json.dumps({**config, "architectures": ["BertForQuestionAnswering"]}))
    with pytest.raises(InputError, match=r"lack 2 of BertForQuestionAnswering's \(e.g. qa_outputs.weight\)"):
        Predictor.from_pretrained(tmp_path / "enc", "cpu")


@pytest.mark.parametrize("setting", [{"doc_stride": 0}, {"problem_type": "ranking"}, {"doc_stride": True}])
def test_a_bad_saved_task_setting_is_one_error_wherever_it_is_read(classifier_dir, tmp_path, capsys, setting):
    """config.py's check is the one check of a fine-tuned model's settings: `bert predict` answers with the
    loader's line, and a Predictor of a model whose config was built in Python with the same."""
    model_dir = tmp_path / "model"
    shutil.copytree(classifier_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, **setting}))
    with pytest.raises(InputError) as loader:
        BertConfig.from_json_file(model_dir / "config.json")
    key = next(iter(setting))
    assert str(loader.value).startswith(f"{model_dir / 'config.json'}: config: {key} ")
    (tmp_path / "texts.txt").write_text("a text\n")
    err = cli_error(capsys, "predict", f"--model={model_dir}", f"--input_file={tmp_path / 'texts.txt'}")
    assert err == f"bert predict: error: {loader.value}"
    good = Predictor.from_pretrained(classifier_dir, "cpu")
    good.model.config.extra.update(setting)
    with pytest.raises(InputError) as built:
        Predictor(good.model, good.tokenizer, good.architecture, good.device, source=str(model_dir))
    assert str(built.value) == str(loader.value)


def test_read_input_record():
    assert read_input_record("plain text", "classification") == ("plain text", None)
    assert read_input_record('{"text": "a", "text_pair": "b"}', "classification") == ("a", "b")
    assert read_input_record('{"text": "a"}', "embeddings") == "a"
    assert read_input_record('{"_id": "d", "title": "T", "text": "a"}', "embeddings") == "T a"  # BEIR corpus
    assert read_input_record('{"title": "T", "text": "a"}', "ner") == "a"
    assert read_input_record("{not json", "fill-mask") == "{not json"
    assert read_input_record('{"question": "q", "context": "c"}', "question-answering") == ("q", "c")
    assert read_input_record('{"context": "c", "endings": ["x", "y"]}', "multiple-choice") == ("c", ["x", "y"])
    for line, task, message in [
        ("", "embeddings", "empty line"),
        ('{"question": "q"}', "question-answering", 'field "context" is missing; keys given: question'),
        ("plain", "question-answering", "needs a JSON object per line"),
        ('{"context": "c", "endings": ["x"]}', "multiple-choice", "at least two"),
        ('{"text": ""}', "classification", 'field "text" must be a non-empty string'),
    ]:
        with pytest.raises(InputError, match=message):
            read_input_record(line, task)


def test_cpu_default_batch_is_cpu_batch_size_and_a_given_one_is_kept(classifier_dir):
    sizes: list[int] = []
    texts = [f"{SENTENCES[i % len(SENTENCES)]} {i}" for i in range(40)]
    for batch_size, expected in ((None, [16, 16, 8]), (32, [32, 8])):
        p = Predictor.from_pretrained(classifier_dir, "cpu", batch_size=batch_size)
        hook = p.model.register_forward_hook(lambda _m, args, _o: sizes.append(args[0].shape[0]))
        try:
            p.classify(texts)
        finally:
            hook.remove()
        assert p.batch_size == (batch_size or CPU_BATCH_SIZE)
        assert sorted(sizes, reverse=True) == expected
        sizes.clear()


def test_cpu_default_batches_hold_at_most_cpu_batch_tokens_and_a_given_size_is_kept(classifier_dir):
    """By default on the CPU a batch holds at most CPU_BATCH_TOKENS tokens by its longest sequence, and
    CPU_BATCH_SIZE sequences; a batch size given to the Predictor or to a call is kept as given."""
    lengths = [300] * 5 + [100] * 20 + [10] * 40
    sequences = [([1] * n, [0] * n) for n in lengths]
    shapes: list[tuple[int, int]] = []

    def fn(ids, mask, types, idx):
        shapes.append(tuple(ids.shape))
        return [None] * len(idx)

    default = Predictor.from_pretrained(classifier_dir, "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one batch at a time: none evened out (the next test)
    try:
        default._run(sequences, fn, None)
    finally:
        torch.set_num_threads(threads)
    assert sum(b for b, _ in shapes) == len(sequences)
    assert all(b * t <= CPU_BATCH_TOKENS or b == 1 for b, t in shapes)
    assert {t: max(b for b, u in shapes if u == t) for _, t in shapes} == {
        300: min(CPU_BATCH_SIZE, CPU_BATCH_TOKENS // 300),
        100: min(CPU_BATCH_SIZE, CPU_BATCH_TOKENS // 100),
        10: CPU_BATCH_SIZE,
    }
    for given, call in ((Predictor.from_pretrained(classifier_dir, "cpu", batch_size=16), None), (default, 16)):
        shapes.clear()
        given._run(sequences, fn, call)
        assert sorted(b for b, _ in shapes) == sorted([16] * 4 + [1])


def test_batches_run_side_by_side_are_evened_out(classifier_dir):
    """A reranking call's 16 pairs cut at CPU_BATCH_TOKENS leave a last batch of one pair, which one thread
    runs while the other waits; run side by side on two threads they are cut into as many batches as a
    multiple of two, no batch over the cap, and `_run` runs those."""
    lengths = [243, 207, 200, 195, 189, 179, 172, 170, 170, 154, 152, 145, 134, 128, 117, 110]

    def cost(bounds):
        return [(stop - start) * lengths[start] for start, stop in bounds]

    alone = batch_bounds(np.array(lengths), CPU_BATCH_SIZE, CPU_BATCH_TOKENS, lanes=1)
    even = batch_bounds(np.array(lengths), CPU_BATCH_SIZE, CPU_BATCH_TOKENS, lanes=2)
    assert [stop - start for start, stop in alone] == [4, 5, 6, 1]
    assert len(even) % 2 == 0 and even[-1][1] == len(lengths)
    assert max(cost(even)) <= CPU_BATCH_TOKENS and min(cost(even)) > max(cost(even)) / 2
    # A batch size given by the caller is kept; a sequence longer than the cap is a batch of its own.
    assert batch_bounds(np.array(lengths), 5, None, lanes=2) == [(0, 5), (5, 10), (10, 15), (15, 16)]
    longer = np.array([2000, 1500, 900, 10, 10, 10, 10, 10, 10])
    for start, stop in batch_bounds(longer, CPU_BATCH_SIZE, CPU_BATCH_TOKENS, lanes=2):
        assert stop - start == 1 or (stop - start) * longer[start] <= CPU_BATCH_TOKENS

    sizes: list[int] = []

    def fn(ids, mask, types, idx):
        sizes.append(ids.shape[0])
        return [None] * len(idx)

    p = Predictor.from_pretrained(classifier_dir, "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        p._run([([1] * n, [0] * n) for n in lengths], fn, None)
    finally:
        torch.set_num_threads(threads)
    assert sorted(sizes) == sorted(stop - start for start, stop in even)


def test_calls_from_several_threads_run_one_at_a_time(classifier_dir):
    p = Predictor.from_pretrained(classifier_dir, "cpu", batch_size=2)
    expected = p.classify(SENTENCES, top_k=0)
    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(p.classify(SENTENCES, top_k=0))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 12
    assert all(r == expected for r in results)


def test_cpu_batches_run_side_by_side_on_one_thread_each_when_they_outnumber_the_threads(classifier_dir):
    p = Predictor.from_pretrained(classifier_dir, "cpu", batch_size=2)
    before = torch.get_num_threads()
    seen: list[tuple[str, int]] = []
    hook = p.model.register_forward_hook(
        lambda *_: seen.append((threading.current_thread().name, torch.get_num_threads()))
    )
    try:
        torch.set_num_threads(1)
        expected = p.classify(SENTENCES, top_k=0)  # one thread: the batches in turn, in this thread
        assert [name for name, _ in seen] == [threading.current_thread().name] * 3
        seen.clear()
        torch.set_num_threads(2)
        assert p.classify(SENTENCES, top_k=0) == expected
        assert len(seen) == 3 and all(name.startswith("bert-batch") and n == 1 for name, n in seen)
        assert torch.get_num_threads() == 2
        seen.clear()
        p.classify(SENTENCES[:4])  # two batches, two threads: each batch on both, in this thread
        assert seen == [(threading.current_thread().name, 2)] * 2

        def fail(*_):
            raise RuntimeError("a batch failed")

        failing = p.model.register_forward_hook(fail)
        with pytest.raises(RuntimeError, match="a batch failed"):
            p.classify(SENTENCES)
        failing.remove()
        assert torch.get_num_threads() == 2
    finally:
        hook.remove()
        torch.set_num_threads(before)
