"""`bert train-embeddings` and `bert train-reranker` end to end on a tiny model, with sentence-transformers as
the oracle: the trained bi-encoder loads in `SentenceTransformer` with the vectors `bert embed` gives, the
reranker in `CrossEncoder` with the scores ours gives, and the evaluations equal sentence-transformers'
evaluators on the same model and data; evaluations between steps leave no packed weights behind."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import numpy as np
import pytest

from bert.commands.train_embeddings import TrainEmbeddingsArgs, run_train_embeddings
from bert.commands.train_reranker import TrainRerankerArgs, run_train_reranker
from bert.errors import InputError
from bert.inference import Predictor
from bert.sentence import runner
from bert.sentence.data import TrainingData, read_beir
from bert.sentence.runner import mine_negatives
from conftest import args_for, assert_model_card, cli_error, model_flags, read_metrics, read_results, read_weights

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle (test extra)")
scipy_stats = pytest.importorskip("scipy.stats", reason="scipy comes with sentence-transformers")
st_evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")

TOPICS = ["music", "cats", "rain", "football", "cooking", "trains", "books", "gardens", "coffee", "mountains"]


def beir_dir(root):
    """A small BEIR directory: per topic two documents, and three queries about the first."""
    (root / "qrels").mkdir(parents=True)
    docs, queries, qrels = [], [], {"train": [], "dev": []}
    for i, t in enumerate(TOPICS):
        docs.append({"_id": f"d{i}", "title": t, "text": f"all about {t} and why people like {t}"})
        docs.append({"_id": f"e{i}", "title": "", "text": f"a note on {t} history"})
        for j, q in enumerate([f"what is {t}", f"tell me about {t}", f"who likes {t}"]):
            queries.append({"_id": f"q{i}_{j}", "text": q})
            qrels["dev" if i % 3 == 0 else "train"].append(f"q{i}_{j}\td{i}\t1")
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, lines in qrels.items():
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(x + "\n" for x in lines))
    return root


@pytest.fixture(scope="module")
def trained(model_files, tmp_path_factory):
    """A bi-encoder trained with MNRL and Matryoshka dims on pairs, evaluated on a BEIR split during and after;
    and what the run wrote on stderr (its result block)."""
    tmp = tmp_path_factory.mktemp("bi")
    beir = beir_dir(tmp / "beir")
    pairs = tmp / "pairs.jsonl"
    pairs.write_text("".join(json.dumps([f"question on {t}", f"an answer about {t}"]) + "\n" for t in TOPICS))
    out = tmp / "out"
    args = args_for(
        TrainEmbeddingsArgs,
        model_files,
        out,
        train_file=str(pairs),
        eval_file=str(beir),
        do_train=True,
        do_eval=True,
        train_batch_size=4,
        num_train_epochs=2.0,
        eval_every_steps=2,
        matryoshka_dims="32,16",
        learning_rate=1e-3,
    )
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        result = run_train_embeddings(args)
    return out, beir, result, stderr.getvalue()


def test_bi_encoder_run_outputs(trained):
    out, _, result, _ = trained
    assert_model_card(out, "train-embeddings", "sentence-similarity", "--matryoshka_dims=32,16")
    assert result["num_train_steps"] == 4  # 10 pairs / 4 = 2 batches (no repeated text) x 2 epochs
    # The exported model is the best evaluation's (the first of equal scores).
    assert result["global_step"] == json.loads((out / "eval_history.json").read_text())["best_step"]
    results = read_results(out / "eval_results.txt")
    for key in ("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100", "map@100"):
        assert f"eval_{key}" in results and f"eval_dim16_{key}" in results
    evals = [m for m in read_metrics(out) if "eval_ndcg@10" in m]
    assert [m["step"] for m in evals] == [2, 4]
    for name in ("modules.json", "1_Pooling/config.json", "sentence_bert_config.json"):
        assert (out / "model" / name).is_file()
    config = json.loads((out / "model" / "config_sentence_transformers.json").read_text())
    assert config["similarity_fn_name"] == "cosine" and config["prompts"] == {}


def test_the_short_form_flags_cut_training_pairs_and_evaluation_queries(model_files, tmp_path, monkeypatch):
    """--max_train_examples trains on the first N pairs; --max_eval_examples evaluates the first M queries of
    the split among all of its documents."""
    from bert.sentence import embedding_run

    beir = beir_dir(tmp_path / "beir")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps([f"question on {t}", f"an answer about {t}"]) + "\n" for t in TOPICS))
    evaluated = []
    real = embedding_run.evaluate_embeddings
    monkeypatch.setattr(
        embedding_run, "evaluate_embeddings", lambda p, data, *a, **k: evaluated.append(data) or real(p, data, *a, **k)
    )
    flags = dict(train_file=str(pairs), eval_file=str(beir), do_train=True, do_eval=True, train_batch_size=2)
    args = args_for(
        TrainEmbeddingsArgs, model_files, tmp_path / "out", **flags, max_train_examples=4, max_eval_examples=3
    )
    result = run_train_embeddings(args)
    assert result["num_train_steps"] == 2 * 3  # 4 pairs / 2 a batch, 3 epochs (10 pairs would be 15 steps)
    split = read_beir(str(beir), "dev")
    assert list(evaluated[-1].queries) == list(split.queries)[:3] and evaluated[-1].documents == split.documents


def test_bi_encoder_result_block(trained):
    out, _, result, stderr = trained
    block = stderr[stderr.index("bert train-embeddings: done\n") :].splitlines()
    assert block[1] == f"  global step {result['global_step']} of 4"
    ndcg = result["eval"]["eval_ndcg@10"]
    assert block[2].startswith("  eval: ") and f"ndcg@10 {ndcg:.4f}" in block[2]
    assert block[3].startswith("  eval at 16 dims: map@100 ")  # 32 is the hidden size: the full vectors' scores
    assert block[4].startswith(f"  written to {out}: model/, eval_results.txt, metrics.jsonl")
    assert block[5] == f"  next: bert embed --model={out / 'model'} --input_file=TEXTS.txt"


def test_sentence_transformers_loads_it_with_our_vectors(trained):
    out = trained[0]
    texts = ["what is rain", "an answer about coffee and why people like it", "x"]
    ours = Predictor.from_pretrained(out / "model", device="cpu").embed(texts)
    theirs = st.SentenceTransformer(str(out / "model"), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


def test_retrieval_evaluation_equals_sentence_transformers(trained):
    out, beir, _, _ = trained
    corpus = read_beir(str(beir), "dev")
    model = st.SentenceTransformer(str(out / "model"), device="cpu")
    evaluator = st_evaluation.InformationRetrievalEvaluator(
        corpus.queries,
        corpus.documents,
        {q: set(d) for q, d in corpus.qrels.items()},
        mrr_at_k=[10],
        ndcg_at_k=[10],
        accuracy_at_k=[1],
        precision_recall_at_k=[1, 10, 100],
        map_at_k=[100],
        batch_size=8,
    )
    theirs = evaluator(model)
    ours = json.loads((out / "eval_results.json").read_text())
    for key in ("mrr@10", "ndcg@10", "recall@1", "recall@10", "recall@100", "map@100"):
        their_key = next(k for k in theirs if k.endswith(f"cosine_{key}"))
        assert abs(ours[f"eval_{key}"] - theirs[their_key]) <= 1e-5, key


def sts_run(model_files, tmp_path, **flags) -> tuple[list[str], TrainEmbeddingsArgs]:
    """Scored pairs on the topics (a .tsv), and train-embeddings' arguments to train 2 steps and evaluate on them."""
    rows = [f"{t} is nice\tpeople like {t}\t{(i % 5) + 0.5}" for i, t in enumerate(TOPICS)]
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(r + "\n" for r in rows))
    args = args_for(
        TrainEmbeddingsArgs,
        model_files,
        tmp_path / "out",
        train_file=str(sts),
        eval_file=str(sts),
        do_train=True,
        train_batch_size=5,
        num_train_epochs=1.0,
        **flags,
    )
    return rows, args


def test_sts_training_and_evaluation_equal_sentence_transformers(model_files, tmp_path):
    rows, args = sts_run(model_files, tmp_path, do_eval=True, pooling="cls", normalize=True)
    result = run_train_embeddings(args)
    assert result["global_step"] == 2
    model = st.SentenceTransformer(str(tmp_path / "out" / "model"), device="cpu")
    a = [r.split("\t")[0] for r in rows]
    b = [r.split("\t")[1] for r in rows]
    scores = [float(r.split("\t")[2]) for r in rows]
    ea, eb = (model.encode(x).astype(np.float64) for x in (a, b))
    cos = np.sum(ea * eb, axis=1) / np.linalg.norm(ea, axis=1) / np.linalg.norm(eb, axis=1)
    assert abs(result["eval"]["eval_spearman"] - scipy_stats.spearmanr(cos, scores).statistic) <= 1e-6
    # This tiny random model's cosines all lie within 1e-7 of 0.99999, so Pearson's r amplifies float32 rounding
    # (our CPU inference kernels against transformers'): equal to 1e-4 here, the vectors to 1e-5 below.
    assert abs(result["eval"]["eval_pearson"] - scipy_stats.pearsonr(cos, scores).statistic) <= 1e-4
    np.testing.assert_allclose(
        Predictor.from_pretrained(tmp_path / "out" / "model", device="cpu").embed(a), model.encode(a), atol=1e-5
    )
    # Evaluation alone scores the exported model, and says which step it comes from.
    again = run_train_embeddings(dataclasses.replace(args, do_train=False))
    assert again["global_step"] == 2 and again["eval"] == result["eval"]


def test_cls_pooled_training_runs_the_last_block_for_cls_alone(model_files, tmp_path, monkeypatch):
    """Under --pooling=cls the training passes ask the encoder for [CLS] alone (that it equals the whole
    block there, gradients too: tests/unit/test_modeling.py); under mean pooling for every token."""
    from bert.modeling import BertModel

    widths: dict[str, set[int]] = {}
    forward = BertModel.forward

    def spy(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self.training:
            widths.setdefault(pooling, set()).add(out.sequence_output.shape[1])
        return out

    monkeypatch.setattr(BertModel, "forward", spy)
    for pooling in ("cls", "mean"):
        (tmp_path / pooling).mkdir()
        _, args = sts_run(model_files, tmp_path / pooling, pooling=pooling)
        assert run_train_embeddings(args)["global_step"] == 2
    assert widths["cls"] == {1} and 1 not in widths["mean"]


def test_mined_negatives_skip_the_positives(model_files):
    anchors = [f"what is {t}" for t in TOPICS] + ["what is rain"]
    positives = [f"all about {t}" for t in TOPICS] + ["rain falls"]
    mined = mine_negatives(str(model_files[2]), TrainingData("x", [anchors, positives]), 3, "cpu", 8)
    assert len(mined.columns) == 5
    for i, a in enumerate(anchors):
        own = {p for x, p in zip(anchors, positives) if x == a}
        negatives = [mined.columns[c][i] for c in range(2, 5)]
        assert len(set(negatives)) == 3 and not own & set(negatives) and set(negatives) <= set(positives)


@pytest.mark.parametrize("loss", ["listwise", "bce"])
def test_reranker_loads_in_cross_encoder_with_our_scores(model_files, tmp_path, loss, capsys):
    beir = beir_dir(tmp_path / "beir")
    args = args_for(
        TrainRerankerArgs,
        model_files,
        tmp_path / "out",
        train_file=str(beir),
        mine_negatives=str(model_files[2]),
        num_negatives=2,
        eval_file=str(beir),
        rerank_top_k=5,
        do_train=True,
        do_eval=True,
        train_batch_size=4,
        num_train_epochs=1.0,
        eval_batch_size=16,
        loss=loss,
    )
    result = run_train_reranker(args)
    assert result["global_step"] == 4  # 6 training topics x 3 queries = 18 / batch 4
    assert_model_card(tmp_path / "out", "train-reranker", "text-ranking", f"--loss={loss}", "--num_negatives=2")
    terminal = capsys.readouterr()
    assert terminal.out == ""  # the result block is on stderr, as every training command's
    retriever = result["eval"]["eval_retriever_mrr@10"]
    assert "\n  eval of the retriever alone: map@100 " in terminal.err and f"mrr@10 {retriever:.4f}" in terminal.err
    assert f"\n  next: bert rerank --model={tmp_path / 'out' / 'model'} --input_file=CANDIDATES.jsonl\n" in terminal.err
    for key in ("mrr@10", "ndcg@10", "recall@1", "map@100"):
        assert f"eval_{key}" in result["eval"] and f"eval_retriever_{key}" in result["eval"]
    pairs = [("what is rain", "all about rain and why people like rain"), ("who likes cats", "a note on trains")]
    ours = Predictor.from_pretrained(tmp_path / "out" / "model", device="cpu").classify(pairs)
    ce = st.CrossEncoder(str(tmp_path / "out" / "model"), device="cpu")
    theirs = ce.predict(pairs)
    np.testing.assert_allclose(1 / (1 + np.exp(-np.array([r["score"] for r in ours]))), theirs, atol=1e-5, rtol=0)


def test_flag_errors_are_one_line(model_files, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('["a b", "c d"]\n' * 4)
    flags = [*model_flags(model_files, tmp_path / "out"), f"--train_file={pairs}", "--do_train"]
    assert "--loss=cosent needs scored pairs" in cli_error(capsys, "train-embeddings", *flags, "--loss=cosent")
    err = cli_error(capsys, "train-embeddings", *flags, "--gradient_accumulation_steps=2")
    assert "--gradient_accumulation_steps=2" in err and "cached_mnrl" in err
    err = cli_error(capsys, "train-reranker", *flags)
    assert "--mine_negatives" in err
    # Limits written next to the flag (check_flag_values), also for Args built in Python.
    assert cli_error(capsys, "train-embeddings", *flags, "--mini_batch_size=0").endswith("must be at least 1")
    assert cli_error(capsys, "train-embeddings", *flags, "--score_scale=0").endswith(
        "--score_scale=0.0 must be positive"
    )
    assert cli_error(capsys, "train-reranker", *flags, "--rerank_top_k=0").endswith("must be at least 1")
    err = cli_error(capsys, "train-embeddings", *flags, "--early_stopping_patience=2")
    assert "--early_stopping_patience needs evaluations during training" in err
    with pytest.raises(InputError, match="--num_negatives=-1 must not be negative"):
        run_train_reranker(TrainRerankerArgs(output_dir=str(tmp_path / "out"), num_negatives=-1, do_train=True))
    assert not (tmp_path / "out" / "args.json").exists()


def test_cached_mnrl_trains_the_weights_mnrl_trains(model_files, tmp_path):
    """Dropout off: gradient caching in mini-batches of 2 gives the weights of the plain loss on batches of 4;
    rerunning a finished run trains nothing more."""
    config = json.loads(model_files[0].read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0}))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps([f"question on {t}", f"an answer about {t}", f"a note on {t}"]) + "\n" for t in TOPICS)
    )
    weights = {}
    for loss in ("mnrl", "cached_mnrl"):
        args = args_for(
            TrainEmbeddingsArgs,
            model_files,
            tmp_path / loss,
            bert_config_file=str(tmp_path / "config.json"),
            train_file=str(pairs),
            do_train=True,
            train_batch_size=4,
            num_train_epochs=1.0,
            learning_rate=1e-3,
            loss=loss,
            mini_batch_size=2,
        )
        assert run_train_embeddings(args)["global_step"] == 2
        weights[loss] = read_weights(tmp_path / loss / "model")
    assert weights["mnrl"].keys() == weights["cached_mnrl"].keys()
    start = {k.removeprefix("bert."): v for k, v in read_weights(model_files[2]).items()}
    for name, value in weights["mnrl"].items():
        np.testing.assert_allclose(weights["cached_mnrl"][name].numpy(), value.numpy(), atol=1e-5, err_msg=name)
    assert weights["mnrl"].keys() <= start.keys()
    assert any(not np.allclose(v.numpy(), start[k].numpy()) for k, v in weights["mnrl"].items())  # it trained
    again = run_train_embeddings(args)
    assert again["global_step"] == 2 and "train" not in again


def test_reranker_micro_batches_train_the_weights_of_the_whole_batch(model_files, tmp_path):
    """Dropout off: the reranker's batch of 4 queries cut into 2 micro-batches (--gradient_accumulation_steps)
    trains the weights of the whole batch, for each loss; 3 steps do not divide a batch of 4."""
    config = json.loads(model_files[0].read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0}))
    tuples = tmp_path / "tuples.jsonl"
    tuples.write_text(
        "".join(json.dumps([f"question on {t}", f"an answer about {t}", f"a note on {t}"]) + "\n" for t in TOPICS)
    )
    for loss in ("listwise", "bce"):
        weights = []
        for steps in (1, 2):
            args = args_for(
                TrainRerankerArgs,
                model_files,
                tmp_path / f"{loss}{steps}",
                bert_config_file=str(tmp_path / "config.json"),
                train_file=str(tuples),
                do_train=True,
                train_batch_size=4,
                num_train_epochs=1.0,
                learning_rate=1e-3,
                loss=loss,
                gradient_accumulation_steps=steps,
            )
            assert run_train_reranker(args)["global_step"] == 2
            weights.append(read_weights(tmp_path / f"{loss}{steps}" / "model"))
        # Adam's first steps divide a gradient by its own size: an element whose gradient is near 0 (the
        # pooler's, under the listwise loss) moves by the rounding of GEMMs of 2 rows against 4, up to 1.5e-5
        # of the 1e-3 step (it was 8e-7 before the last block ran for [CLS] alone): 5e-5 is 5% of a step.
        for name, value in weights[0].items():
            np.testing.assert_allclose(weights[1][name].numpy(), value.numpy(), atol=5e-5, err_msg=name)
    with pytest.raises(InputError, match="--train_batch_size=4 must be divisible by"):
        run_train_reranker(dataclasses.replace(args, gradient_accumulation_steps=3, output_dir=str(tmp_path / "x")))


def test_an_unknown_best_metric_is_refused_before_training(model_files, tmp_path, capsys):
    beir = beir_dir(tmp_path / "beir")
    flags = [*model_flags(model_files, tmp_path / "out"), f"--train_file={beir}", f"--eval_file={beir}", "--do_train"]
    err = cli_error(capsys, "train-embeddings", *flags, "--train_batch_size=4", "--metric_for_best_model=eval_f1")
    assert "eval_ndcg@10" in err and "eval_map@100" in err
    assert not (tmp_path / "out" / "args.json").exists()


def test_reranker_mining_and_evaluation_stream_in_blocks_with_bars(model_files, tmp_path, monkeypatch, progress_bars):
    """Mining and evaluation show progress bars; evaluation scores the queries' candidates a block of
    BLOCK_BATCHES batches at a time (never all of them at once), and its metrics are those of the exported
    model's CrossEncoder scores."""
    beir = beir_dir(tmp_path / "beir")
    largest = []
    logits = Predictor.classification_logits

    def recording(self, inputs, *a, **k):
        largest.append(len(inputs))
        return logits(self, inputs, *a, **k)

    monkeypatch.setattr(Predictor, "classification_logits", recording)
    flags = dict(train_file=str(beir), mine_negatives=str(model_files[2]), num_negatives=2, eval_file=str(beir))
    args = args_for(
        TrainRerankerArgs,
        model_files,
        tmp_path / "out",
        **flags,
        rerank_top_k=5,
        do_train=True,
        do_eval=True,
        train_batch_size=4,
        num_train_epochs=0.5,
        eval_every_steps=1,
        eval_batch_size=2,
    )
    result = run_train_reranker(args)
    bars = progress_bars()
    assert bars["mine negatives: queries"] == (18, 18) and bars["mine negatives: documents"] == (6, 6)
    # The dev split: 4 topics x 3 queries, over the 4 documents its qrels name.
    assert bars["eval: queries"] == (12, 12) and bars["eval: corpus"] == (4, 4) and bars["eval: rerank"] == (12, 12)
    # 12 queries x 4 candidates = 48 pairs per evaluation, in blocks of at most 2 x BLOCK_BATCHES = 32.
    assert 0 < max(largest) <= 2 * runner.BLOCK_BATCHES < 48 and sum(largest) == 48 * 3  # two steps and the end
    ce = st.CrossEncoder(str(tmp_path / "out" / "model"), device="cpu")
    corpus = read_beir(str(beir), "dev")
    reciprocal = []
    for qid, query in corpus.queries.items():
        dids = list(corpus.documents)
        scores = ce.predict([(query, corpus.documents[d]) for d in dids])
        ranked = [dids[j] for j in np.argsort(-scores, kind="stable")]
        reciprocal.append(1 / (1 + next(i for i, d in enumerate(ranked) if d in corpus.qrels[qid])))
    assert result["eval"]["eval_mrr@10"] == pytest.approx(np.mean(reciprocal), abs=1e-6)


def test_train_embeddings_evaluation_shows_bars(model_files, tmp_path, progress_bars):
    _, args = sts_run(model_files, tmp_path, do_eval=True, eval_every_steps=1)
    run_train_embeddings(args)
    bars = progress_bars()
    assert bars["eval: first texts"] == (10, 10) and bars["eval: second texts"] == (10, 10)


def test_evaluations_between_steps_drop_the_packed_weights(model_files, tmp_path, monkeypatch):
    """An evaluation during training runs a Predictor on the training model, which packs its weights for
    inference; the copies are dropped after it (the next step makes them stale), not held through training."""
    import torch

    from bert import cpu_kernels
    from bert.sentence import runner

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN, so nothing is packed")
    seen = []

    def packed(weights):
        return sum(cpu_kernels._PACKED.get(id(w), (None, None, None))[2] is not None for w in weights)

    def spy(model):
        weights = [m.weight for m in model.modules() if type(m) is torch.nn.Linear]
        before = packed(weights)
        cpu_kernels.release_packed_weights(model)
        seen.append((len(weights), before, packed(weights)))

    monkeypatch.setattr(runner, "release_packed_weights", spy)
    _, args = sts_run(model_files, tmp_path, eval_every_steps=1)
    assert run_train_embeddings(args)["num_train_steps"] == 2
    assert len(seen) == 2 and all(n > 0 and before == n and after == 0 for n, before, after in seen)
