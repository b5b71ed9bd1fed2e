"""The losses of `bert train-embeddings` and `bert train-reranker` against sentence-transformers' own, on the
same batch and weights: a tiny random BERT saved as a sentence-transformers directory is loaded by both
sides; our embeddings come from `bert.sentence.runner`'s sequences, `BertModel` and `pool_tokens`, theirs from
`SentenceTransformer`; the losses must agree to 1e-5. Gradient caching must equal the plain loss in value
and in every parameter's gradient."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from bert.checkpoint import read_checkpoint, save_pretrained
from bert.modeling import BertForSequenceClassification, BertModel, pool_tokens
from bert.sentence import losses
from bert.sentence.runner import pair_sequences, single_sequences
from bert.sentence.st_format import sentence_transformers_files
from bert.tokenization import FullTokenizer
from conftest import uncased_vocab, vocab_config

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle (test extra)")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
ce_losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")

ANCHORS = ["a man plays the guitar", "the cat sleeps", "rain falls on the city", "children run in a park"]
POSITIVES = ["someone is playing music", "a cat is asleep", "it is raining downtown", "kids are playing outside"]
NEGATIVES = ["the stock market fell", "a dog barks at night", "the sun is shining", "an old man reads a book"]
SCORES = [0.9, 0.2, 0.55, 0.2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(our BertModel, tokenizer, SentenceTransformer) over the same tiny random weights, mean pooling."""
    d = tmp_path_factory.mktemp("st")
    vocab = uncased_vocab(d)
    torch.manual_seed(0)
    model = BertModel(vocab_config(vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), False)
    save_pretrained(model, d / "model", vocab, do_lower_case=True)
    for name, obj in sentence_transformers_files("mean", False, 64, 32).items():
        (d / "model" / name).parent.mkdir(parents=True, exist_ok=True)
        (d / "model" / name).write_text(json.dumps(obj))
    ours = BertModel(read_checkpoint(d / "model").config, add_pooling_layer=False)
    ours.load_state_dict(model.state_dict())
    ours.eval()
    theirs = st.SentenceTransformer(str(d / "model"), device="cpu")
    theirs.eval()
    return ours, FullTokenizer(str(vocab), do_lower_case=True), theirs, d / "model"


def our_embeddings(models, *columns):
    model, tokenizer = models[0], models[1]
    out = []
    for texts in columns:
        batch = single_sequences(tokenizer, list(texts), 64).collate(np.arange(len(texts)))
        hidden = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).sequence_output
        out.append(pool_tokens(hidden, batch["attention_mask"], "mean"))
    return out


def their_loss(models, loss, *columns, labels=None):
    theirs = models[2]
    features = [theirs.tokenize(list(c)) for c in columns]
    return float(loss(features, labels if labels is not None else torch.zeros(len(columns[0]))).detach())


def test_the_models_embed_alike(models):
    (ours,) = our_embeddings(models, ANCHORS)
    theirs = models[2].encode(ANCHORS, convert_to_tensor=True)
    torch.testing.assert_close(ours.detach(), theirs, atol=1e-5, rtol=0)


def test_mnrl_with_hard_negatives(models):
    ours = losses.mnrl(our_embeddings(models, ANCHORS, POSITIVES, NEGATIVES))
    expected = their_loss(models, st_losses.MultipleNegativesRankingLoss(models[2]), ANCHORS, POSITIVES, NEGATIVES)
    assert abs(float(ours) - expected) <= 1e-5


def test_symmetric_mnrl(models):
    ours = losses.mnrl(our_embeddings(models, ANCHORS, POSITIVES), symmetric=True)
    loss = st_losses.MultipleNegativesRankingLoss(
        models[2], directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction"
    )
    assert abs(float(ours) - their_loss(models, loss, ANCHORS, POSITIVES)) <= 1e-5
    assert abs(float(ours) - float(losses.mnrl(our_embeddings(models, ANCHORS, POSITIVES)))) > 1e-4


@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_of_one_process_anchors_equals_gather_across_devices(models, symmetric, monkeypatch):
    """--gather_across_devices on rank 1 of 2: our loss of the gathered columns over that rank's anchors equals
    sentence-transformers' with gather_across_devices=True, its gather given the same global columns; the
    ranks' losses average to the whole batch's, and differ from the loss of the rank's own rows alone."""
    columns = (ANCHORS + POSITIVES, POSITIVES + NEGATIVES, NEGATIVES + ANCHORS)  # 8 distinct rows
    gathered = [e.detach() for e in our_embeddings(models, *columns)]
    mnrl_module = st_losses.MultipleNegativesRankingLoss.__module__
    # Their loss gathers the rank's own rows into these global columns; rank 1 owns the last 4 rows.
    local = [g[4:] for g in gathered]
    by_local = {id(e): g for e, g in zip(local, gathered)}
    monkeypatch.setattr(f"{mnrl_module}.all_gather_with_grad", lambda t: by_local[id(t)])
    monkeypatch.setattr(f"{mnrl_module}.get_rank", lambda: 1)
    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    loss = st_losses.MultipleNegativesRankingLoss(
        models[2], directions=directions, partition_mode="per_direction", gather_across_devices=True
    )
    expected = float(loss.compute_loss_from_embeddings(local, torch.zeros(4)))
    rows = [torch.arange(0, 4), torch.arange(4, 8)]
    ours = [float(losses.mnrl(gathered, symmetric=symmetric, anchors=r)) for r in rows]
    assert abs(ours[1] - expected) <= 1e-5
    assert abs((ours[0] + ours[1]) / 2 - float(losses.mnrl(gathered, symmetric=symmetric))) <= 1e-5
    assert abs(ours[1] - float(losses.mnrl(local, symmetric=symmetric))) > 1e-3


def test_cosent_and_cosine_mse(models):
    a, b = our_embeddings(models, ANCHORS, POSITIVES)
    labels = torch.tensor(SCORES)
    expected = their_loss(models, st_losses.CoSENTLoss(models[2]), ANCHORS, POSITIVES, labels=labels)
    assert abs(float(losses.cosent(a, b, labels)) - expected) <= 1e-5
    expected = their_loss(models, st_losses.CosineSimilarityLoss(models[2]), ANCHORS, POSITIVES, labels=labels)
    assert abs(float(losses.cosine_mse(a, b, labels)) - expected) <= 1e-5


@pytest.mark.parametrize("inner", ["mnrl", "cosent"])
def test_matryoshka(models, inner):
    dims = [32, 16, 8]
    labels = torch.tensor(SCORES)
    emb = our_embeddings(models, ANCHORS, POSITIVES)
    if inner == "mnrl":
        ours = losses.matryoshka(losses.mnrl, emb, dims)
        base = st_losses.MultipleNegativesRankingLoss(models[2])
    else:
        ours = losses.matryoshka(lambda e: losses.cosent(e[0], e[1], labels), emb, dims)
        base = st_losses.CoSENTLoss(models[2])
    expected = their_loss(models, st_losses.MatryoshkaLoss(models[2], base, dims), ANCHORS, POSITIVES, labels=labels)
    assert abs(float(ours) - expected) <= 1e-5


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("symmetric", [False, True])
def test_cached_mnrl_equals_mnrl_in_loss_and_gradients(models, symmetric):
    model, tokenizer = models[0], models[1]
    columns = [ANCHORS, POSITIVES, NEGATIVES]
    batches = [single_sequences(tokenizer, c, 64).collate(np.arange(len(c))) for c in columns]

    def encode(c, rows=slice(None)):
        b = batches[c]
        mask = b["attention_mask"][rows]
        out = model(b["input_ids"][rows], mask, b["token_type_ids"][rows])
        return pool_tokens(out.sequence_output, mask, "mean")

    model.zero_grad()
    plain = losses.mnrl([encode(c) for c in range(3)], symmetric=symmetric)
    plain.backward()
    expected = _grads(model)
    model.zero_grad()
    cached = losses.cached_mnrl_backward(
        encode, 4, 3, 3, lambda e: losses.mnrl(e, symmetric=symmetric), torch.device("cpu")
    )
    got = _grads(model)
    model.zero_grad()
    assert abs(float(cached) - float(plain)) <= 1e-6
    assert got.keys() == expected.keys() and expected
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-4, msg=name)
    if not symmetric:
        loss = st_losses.CachedMultipleNegativesRankingLoss(models[2], mini_batch_size=3)
        assert abs(float(cached) - their_loss(models, loss, *columns)) <= 1e-5


def test_cached_mnrl_replays_dropout(models):
    """With dropout on, each recomputed mini-batch draws the dropout masks of its first pass, so the gradient
    applied is that of the loss reported."""
    model, tokenizer = models[0], models[1]
    config = type(model.config).from_dict({**model.config.to_dict(), "hidden_dropout_prob": 0.3})
    dropped = BertModel(config, add_pooling_layer=False)
    dropped.load_state_dict(model.state_dict())
    dropped.train()
    b = single_sequences(tokenizer, ANCHORS, 64).collate(np.arange(4))
    seen = []

    def encode(c, rows=slice(None)):
        out = dropped(b["input_ids"][rows], b["attention_mask"][rows], b["token_type_ids"][rows])
        v = pool_tokens(out.sequence_output, b["attention_mask"][rows], "mean")
        seen.append(v.detach().clone())
        return v

    losses.cached_mnrl_backward(encode, 4, 2, 2, losses.mnrl, torch.device("cpu"))
    first, second = seen[:4], seen[4:]
    assert not torch.equal(first[0], first[2])  # dropout is on: two passes over the same rows would differ
    for x, y in zip(first, second):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------- reranker
def test_reranker_losses(models):
    """Pointwise BCE and listwise cross-entropy equal CrossEncoder's BinaryCrossEntropyLoss and (on the hard
    negatives) MultipleNegativesRankingLoss, the CrossEncoder loading our saved reranker."""
    tokenizer, directory = models[1], models[3]
    torch.manual_seed(1)
    config = read_checkpoint(directory).config
    config.extra.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    model = BertForSequenceClassification(config, num_labels=1).eval()
    save_pretrained(model, directory.parent / "ce", directory / "vocab.txt", do_lower_case=True)
    ce = st.CrossEncoder(str(directory.parent / "ce"), device="cpu")
    ce.eval()
    pairs = [(a, t) for a, p, n in zip(ANCHORS, POSITIVES, NEGATIVES) for t in (p, n)]
    batch = pair_sequences(tokenizer, pairs, 64).collate(np.arange(len(pairs)))
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits[:, 0]
    labels = torch.tensor([1.0, 0.0] * 4)
    bce = ce_losses.BinaryCrossEntropyLoss(ce)
    expected = float(bce([[a for a, _ in pairs], [t for _, t in pairs]], labels))
    assert abs(float(losses.pointwise_bce(logits, labels)) - expected) <= 1e-5
    grouped = logits.view(4, 2)  # [queries, positive + negative]
    their_scores = [
        bce.model(bce.model.preprocess(list(zip(ANCHORS, c))))["scores"].view(-1) for c in (POSITIVES, NEGATIVES)
    ]
    expected = ce_losses.MultipleNegativesRankingLoss(ce).calculate_loss(their_scores, 4)
    assert abs(float(losses.listwise_ce(grouped)) - float(expected)) <= 1e-5


# --------------------------------------------------------------------------------------- distillation
NEGATIVES_2 = ["a bird sings", "the train is late", "snow covers the hills", "the soup is cold"]


def _teacher(*shape: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_mse_equals_mse_loss(models):
    """One column against its teacher's vectors, and two columns each against its own (3-D labels)."""
    teacher = _teacher(4, 32)
    (a,) = our_embeddings(models, ANCHORS)
    expected = their_loss(models, st_losses.MSELoss(models[2]), ANCHORS, labels=teacher)
    assert abs(float(losses.mse([a], [teacher])) - expected) <= 1e-5
    columns = _teacher(4, 2, 32, seed=4)
    a, b = our_embeddings(models, ANCHORS, POSITIVES)
    ours = losses.mse([a, b], [columns[:, 0], columns[:, 1]])
    expected = their_loss(models, st_losses.MSELoss(models[2]), ANCHORS, POSITIVES, labels=columns)
    assert abs(float(ours) - expected) <= 1e-5


def test_matryoshka_mse(models):
    """The student's vectors cut and re-normalised, the teacher's only cut, as MatryoshkaLoss does."""
    dims = [32, 16, 8]
    teacher = _teacher(4, 32)
    ours = losses.matryoshka(lambda e: losses.mse(e, [teacher]), our_embeddings(models, ANCHORS), dims)
    loss = st_losses.MatryoshkaLoss(models[2], st_losses.MSELoss(models[2]), dims)
    assert abs(float(ours) - their_loss(models, loss, ANCHORS, labels=teacher)) <= 1e-5


@pytest.mark.parametrize("negatives", [1, 2])
def test_margin_mse_equals_margin_mse_loss(models, negatives):
    columns = [ANCHORS, POSITIVES, NEGATIVES, NEGATIVES_2][: 2 + negatives]
    teacher = _teacher(4, 1 + negatives) * 5  # a cross-encoder's logits: the positive's and each negative's
    ours = losses.margin_mse(losses.dot_scores(our_embeddings(models, *columns)), teacher)
    expected = their_loss(models, st_losses.MarginMSELoss(models[2]), *columns, labels=teacher)
    assert abs(float(ours) - expected) <= 1e-5


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_distill_kl_equals_distill_kl_div_loss(models, temperature):
    columns = [ANCHORS, POSITIVES, NEGATIVES, NEGATIVES_2]
    teacher = _teacher(4, 3) * 4
    ours = losses.distill_kl(losses.dot_scores(our_embeddings(models, *columns)), teacher, temperature)
    loss = st_losses.DistillKLDivLoss(models[2], temperature=temperature)
    assert abs(float(ours) - their_loss(models, loss, *columns, labels=teacher)) <= 1e-5


def test_reranker_distillation_losses(models):
    """A cross-encoder student on (query, positive, negative, negative) groups: `margin_mse` of its logits equals
    CrossEncoder MarginMSELoss; `distill_kl` (temperature 1) equals ListNetLoss, the cross-entropy to the
    teacher's softmax, less the teacher distribution's entropy (KL = cross-entropy - entropy)."""
    tokenizer, directory = models[1], models[3]
    torch.manual_seed(2)
    config = read_checkpoint(directory).config
    config.extra.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    model = BertForSequenceClassification(config, num_labels=1).eval()
    save_pretrained(model, directory.parent / "ce_student", directory / "vocab.txt", do_lower_case=True)
    ce = st.CrossEncoder(str(directory.parent / "ce_student"), device="cpu")
    ce.eval()
    documents = [POSITIVES, NEGATIVES, NEGATIVES_2]
    pairs = [(a, d[i]) for i, a in enumerate(ANCHORS) for d in documents]  # query-major, as the runner's batches
    batch = pair_sequences(tokenizer, pairs, 64).collate(np.arange(len(pairs)))
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits[:, 0].view(4, 3)
    teacher = _teacher(4, 3) * 4
    expected = float(ce_losses.MarginMSELoss(ce)([ANCHORS, *documents], teacher))
    assert abs(float(losses.margin_mse(logits, teacher)) - expected) <= 1e-5
    listnet = ce_losses.ListNetLoss(ce)([ANCHORS, [list(d) for d in zip(*documents)]], list(teacher))
    p = torch.softmax(teacher, dim=1)
    entropy = float(-(p * p.log()).sum(1).mean())
    assert abs(float(losses.distill_kl(logits, teacher)) - (float(listnet) - entropy)) <= 1e-5


def test_every_loss_choice_is_in_the_runners_table():
    """--loss's choices (the commands' flags, torch-free) are the names of the runner's table of what each needs."""
    from bert.commands.train_embeddings import TrainEmbeddingsArgs
    from bert.commands.train_reranker import TrainRerankerArgs
    from bert.sentence.loss_table import EMBEDDING_LOSS_TABLE, RERANKER_LOSS_TABLE

    [EMBEDDING_LOSSES, RERANKER_LOSSES] = [
        tuple(next(f for f in dataclasses.fields(args) if f.name == "loss").metadata["choices"])
        for args in (TrainEmbeddingsArgs, TrainRerankerArgs)
    ]

    assert tuple(EMBEDDING_LOSS_TABLE) == EMBEDDING_LOSSES and tuple(RERANKER_LOSS_TABLE) == RERANKER_LOSSES
    distill = {name for name, spec in {**EMBEDDING_LOSS_TABLE, **RERANKER_LOSS_TABLE}.items() if spec.teacher}
    assert distill == {"mse", "margin_mse", "distill_kl"}
