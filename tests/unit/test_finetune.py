"""The fine-tuning runner's pieces: which features make each step's batch (`BatchPlan`, `train_batches`), the
evaluations during training (`training.EvalHistory`), inference in length-sorted batches (`predict`) and the
Estimator's two losses (`loss_metrics`)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from bert.batching import GROUP_BATCHES, BatchPlan, RecordStream
from bert.config import BertConfig
from bert.distributed import DistContext
from bert.evaluations import EvalHistory
from bert.finetune import (
    Predictions,
    loss_metrics,
    predict,
    saved_label_list,
    train_batches,
)
from bert.tasks.common import FinetuneTask, pad_2d

CPU = DistContext(torch.device("cpu"))


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 129, n)


def _steps(plan: BatchPlan, start: int, count: int) -> list[np.ndarray]:
    return [plan.batch(step) for step in range(start, start + count)]


# ----------------------------------------------------------------------------------------------- BatchPlan
@pytest.mark.parametrize("group_by_length", [True, False])
def test_every_feature_once_per_epoch_in_full_batches(group_by_length):
    # 800 features, batches of 8: an epoch is 100 steps, 2 mega-batches of 50 batches.
    plan = BatchPlan(_lengths(800), batch_size=8, seed=3, group_by_length=group_by_length)
    for epoch in range(3):
        batches = _steps(plan, 100 * epoch, 100)
        assert all(len(b) == 8 for b in batches)
        assert sorted(np.concatenate(batches).tolist()) == list(range(800)), epoch
    # 1000 features: epochs end inside a mega-batch, which mixes the two epochs' features; over 2 epochs
    # (5 mega-batches) every feature is still taken exactly twice.
    plan = BatchPlan(_lengths(1000), batch_size=8, seed=3, group_by_length=group_by_length)
    assert np.bincount(np.concatenate(_steps(plan, 0, 250))).tolist() == [2] * 1000


def test_length_grouping_within_mega_batches_of_50():
    lengths = _lengths(1000)
    plan = BatchPlan(lengths, batch_size=8, seed=3)
    stream = RecordStream(1000, seed=3)
    size = GROUP_BATCHES * 8  # 400 features per mega-batch
    assert GROUP_BATCHES == 50
    for group in range(3):
        batches = _steps(plan, GROUP_BATCHES * group, GROUP_BATCHES)
        # A mega-batch holds exactly the next 400 features of the seeded stream...
        taken, _ = stream.take(group * size, size)
        assert sorted(np.concatenate(batches).tolist()) == sorted(taken.tolist())
        # ... sorted by length (longest first) and cut into batches: the batches' length ranges do not overlap.
        for b in batches:
            assert (np.diff(lengths[b]) <= 0).all()
        by_length = sorted(batches, key=lambda b: -lengths[b].max())
        for longer, shorter in zip(by_length, by_length[1:]):
            assert lengths[longer].min() >= lengths[shorter].max()
        # The batches of a mega-batch come in shuffled order, not longest first.
        firsts = [int(lengths[b][0]) for b in batches]
        assert firsts != sorted(firsts, reverse=True)
    # Grouped batches are far more uniform in length than ungrouped ones (the point of grouping).
    spread = [np.ptp(lengths[b]) for b in _steps(plan, 0, 100)]
    plain = [np.ptp(lengths[b]) for b in _steps(BatchPlan(lengths, 8, 3, group_by_length=False), 0, 100)]
    assert np.mean(spread) < np.mean(plain) / 10


def test_without_grouping_batches_are_the_stream_in_order():
    plan = BatchPlan(_lengths(10), batch_size=4, seed=5, group_by_length=False)
    stream = RecordStream(10, seed=5)
    # Step 2 takes stream positions 8..11: the last two of epoch 0, the first two of epoch 1.
    assert plan.batch(2).tolist() == [*stream.order(0)[8:], *stream.order(1)[:2]]
    assert np.concatenate(_steps(plan, 0, 5)).tolist() == [*stream.order(0), *stream.order(1)]


def test_batches_cross_epoch_boundaries():
    # 100 features and mega-batches of 50 x 8 = 400: one mega-batch spans 4 epochs, each feature 4 times.
    lengths = _lengths(100)
    plan = BatchPlan(lengths, batch_size=8, seed=1)
    batches = _steps(plan, 0, GROUP_BATCHES)
    assert all(len(b) == 8 for b in batches)
    assert np.bincount(np.concatenate(batches), minlength=100).tolist() == [4] * 100
    # The next mega-batch continues with epoch 4's permutation.
    assert sorted(np.concatenate(_steps(plan, GROUP_BATCHES, GROUP_BATCHES)).tolist()) == sorted(list(range(100)) * 4)


def test_deterministic_for_a_seed_and_resumable_at_any_step():
    lengths = _lengths(300)
    plan = BatchPlan(lengths, batch_size=6, seed=12345)
    batches = _steps(plan, 0, 130)  # 2.6 mega-batches, 2.6 epochs
    again = _steps(BatchPlan(lengths, batch_size=6, seed=12345), 0, 130)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    other = _steps(BatchPlan(lengths, batch_size=6, seed=54321), 0, 130)
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other))
    # A new plan asked for step k first (as after a restart from checkpoint-k) gives the same batches.
    for k in (0, 37, 49, 50, 51, 77, 129):
        resumed = BatchPlan(lengths, batch_size=6, seed=12345)
        assert [b.tolist() for b in _steps(resumed, k, 130 - k)] == [b.tolist() for b in batches[k:]], k
    assert plan.state(7) == {"step": 7, "num_features": 300, "seed": 12345, "batch_size": 6, "group_by_length": True}


class _ToyTask(FinetuneTask):
    """Features are lists of token ids; a batch is the ids padded with 0 and the attention mask."""

    head = "toy"

    def feature_length(self, feature) -> int:
        return len(feature)

    def collate(self, features, pad_to):
        ids = pad_2d(features, pad_to)
        return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}


def test_train_batches_split_the_global_batch_over_ranks_and_micro_batches():
    features = [[i + 1] * (1 + i % 7) for i in range(40)]
    plan = BatchPlan([len(f) for f in features], batch_size=8, seed=2)
    task = _ToyTask()
    for step in (0, 3):
        parts = []
        for rank in range(2):
            it = train_batches(plan, task, features, step, rank, 2, accumulation=2, pad_to=None)
            micro = next(it)
            assert len(micro) == 2 and all(mb["input_ids"].shape[0] == 2 for mb in micro)
            parts += micro
        # Rank 0's micro-batches, then rank 1's, are the step's batch in order, each padded to its own longest.
        got = [int(row[0]) - 1 for mb in parts for row in mb["input_ids"]]
        assert got == plan.batch(step).tolist()
        for mb in parts:
            assert mb["input_ids"].shape[1] == mb["attention_mask"].sum(1).max()
    fixed = next(train_batches(plan, task, features, 0, 0, 1, accumulation=1, pad_to=16))
    assert fixed[0]["input_ids"].shape == (8, 16)


# --------------------------------------------------------------------------------------------- EvalHistory
def test_best_step_maximises_scores_and_minimises_losses(tmp_path):
    accuracy = EvalHistory(tmp_path / "h.json", "eval_accuracy", patience=0)
    loss = EvalHistory(tmp_path / "l.json", "eval_loss", patience=0)
    assert accuracy.best() is None
    scores = [(2, 0.5, 0.9), (4, 0.7, 0.6), (6, 0.7, 0.4), (8, 0.6, 0.5)]
    for step, acc, value in scores:
        assert not accuracy.add(step, {"eval_accuracy": acc, "eval_loss": value})
        assert not loss.add(step, {"eval_accuracy": acc, "eval_loss": value})
    assert accuracy.greater_is_better and not loss.greater_is_better
    assert accuracy.best()["step"] == 4  # the first of equal scores: a later tie is no improvement
    assert loss.best()["step"] == 6
    assert accuracy.evaluated(6) and not accuracy.evaluated(5)
    assert accuracy.stopped_at is None  # patience 0: never stops


def test_early_stopping_after_patience_evaluations_without_improvement(tmp_path, caplog):
    history = EvalHistory(tmp_path / "h.json", "eval_f1", patience=2)
    stops = [history.add(step, {"eval_f1": f1}) for step, f1 in ((1, 0.2), (2, 0.4), (3, 0.3), (4, 0.5), (5, 0.5))]
    assert stops == [False] * 5  # 0.5 at step 4 improved; step 5 is one evaluation without improvement
    with caplog.at_level(logging.INFO, logger="bert.evaluations"):
        assert history.add(6, {"eval_f1": 0.45})
    assert history.stopped_at == 6 and history.best()["step"] == 4
    assert "has not improved for 2 evaluations (best 0.5 at step 4)" in caplog.text


def test_saved_history_loads_only_the_evaluations_up_to_the_resumed_step(tmp_path, caplog):
    path = tmp_path / "eval_history.json"
    history = EvalHistory(path, "eval_loss", patience=1)
    for step, value in ((10, 0.9), (20, 0.5), (30, 0.7)):
        history.add(step, {"eval_loss": value})
    history.save()
    saved = json.loads(path.read_text())
    assert saved == {
        "metric": "eval_loss",
        "greater_is_better": False,
        "best_step": 20,
        "best_value": 0.5,
        "stopped_at": 30,
        "evaluations": [{"step": s, "metrics": {"eval_loss": v}} for s, v in ((10, 0.9), (20, 0.5), (30, 0.7))],
    }
    # Resuming from checkpoint-20 forgets the evaluation of step 30 and the early stop it caused.
    resumed = EvalHistory(path, "eval_loss", patience=1)
    resumed.load(20)
    assert [e["step"] for e in resumed.evaluations] == [10, 20] and resumed.stopped_at is None
    finished = EvalHistory(path, "eval_loss", patience=1)
    finished.load(30)
    assert len(finished.evaluations) == 3 and finished.stopped_at == 30
    # Another metric ranks the same evaluations, with a warning; no file leaves the history empty.
    with caplog.at_level(logging.WARNING, logger="bert.evaluations"):
        other = EvalHistory(path, "loss", patience=0)
        other.load(30)
    assert "ranked by eval_loss, now by loss" in caplog.text
    empty = EvalHistory(tmp_path / "none.json", "eval_loss", patience=0)
    empty.load(100)
    assert empty.evaluations == [] and empty.stopped_at is None


# ------------------------------------------------------------------------------------ predict, loss_metrics
@dataclass
class _Out:
    logits: torch.Tensor
    example_loss: torch.Tensor
    example_count: torch.Tensor


class _ToyModel(torch.nn.Module):
    """Logits [B, 2]: (first id, number of real tokens); loss terms: one per real token, each equal to the first
    id. Records the shape of every batch it sees."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, int]] = []
        self.lengths: list[list[int]] = []

    def forward(self, input_ids, attention_mask):
        self.shapes.append(tuple(input_ids.shape))
        self.lengths.append(attention_mask.sum(1).tolist())
        n = attention_mask.sum(1).double()
        first = input_ids[:, 0].double()
        return _Out(torch.stack([first, n], 1).float(), first * n, n)


def _toy_features(n: int = 23) -> list[list[int]]:
    lengths = np.random.default_rng(4).integers(1, 20, n)
    return [[i + 1] * int(k) for i, k in enumerate(lengths)]


@pytest.mark.parametrize("group_by_length", [True, False])
@pytest.mark.parametrize("pad_to", [None, 24])
def test_predict_restores_the_input_order(group_by_length, pad_to):
    features = _toy_features()
    model = _ToyModel().train()
    pred = predict(model, _ToyTask(), features, 5, CPU, group_by_length=group_by_length, pad_to=pad_to)
    assert model.training  # the mode is restored
    assert [o.tolist() for o in pred.outputs] == [[i + 1, len(f)] for i, f in enumerate(features)]
    np.testing.assert_array_equal(pred.loss_count, [len(f) for f in features])
    np.testing.assert_array_equal(pred.loss_sum, [(i + 1) * len(f) for i, f in enumerate(features)])
    assert [s[0] for s in model.shapes] == [5, 5, 5, 5, 3]
    if pad_to is not None:
        assert {s[1] for s in model.shapes} == {24}
    else:  # each batch padded to its own longest feature
        assert [s[1] for s in model.shapes] == [max(n) for n in model.lengths]
    seen = [n for batch in model.lengths for n in batch]
    if group_by_length:  # longest first, so batches hold similar lengths
        assert seen == sorted((len(f) for f in features), reverse=True)
    else:
        assert seen == [len(f) for f in features]


def test_predict_on_two_ranks_shares_the_batches_and_gathers_every_output():
    features = _toy_features()

    class Rank(DistContext):
        def __init__(self, rank, others):
            super().__init__(torch.device("cpu"), rank=rank, world_size=2)
            self.others = others

        def gather_object(self, obj):
            self.mine = obj
            return [obj, *self.others]

    second = Rank(1, [])
    model = _ToyModel()
    predict(model, _ToyTask(), features, 4, second)
    assert len(model.shapes) == 3  # batches 1, 3 and 5 of 6
    first = Rank(0, [second.mine])
    pred = predict(_ToyModel(), _ToyTask(), features, 4, first)
    assert [o.tolist() for o in pred.outputs] == [[i + 1, len(f)] for i, f in enumerate(features)]
    np.testing.assert_array_equal(pred.loss_sum, [(i + 1) * len(f) for i, f in enumerate(features)])


def test_loss_metrics_eval_loss_and_the_estimators_mean_of_batch_means():
    # Five examples with one loss term each, batches of 2 in input order: means 1.5, 3.5 and 10.
    pred = Predictions([None] * 5, np.array([1.0, 2.0, 3.0, 4.0, 10.0]), np.ones(5))
    assert loss_metrics(pred, 2) == {"eval_loss": 4.0, "loss": pytest.approx((1.5 + 3.5 + 10) / 3)}
    assert loss_metrics(pred, 5) == {"eval_loss": 4.0, "loss": 4.0}  # one batch: the two agree
    # Several terms per example (NER's tokens): eval_loss is per term; a batch without terms is skipped.
    tokens = Predictions([None] * 4, np.array([6.0, 1.0, 0.0, 4.0]), np.array([3.0, 1.0, 0.0, 1.0]))
    assert loss_metrics(tokens, 1) == {"eval_loss": 11.0 / 5, "loss": pytest.approx((2.0 + 1.0 + 4.0) / 3)}
    assert loss_metrics(Predictions([], np.zeros(0), np.zeros(0)), 8) == {"eval_loss": 0.0, "loss": 0.0}


def test_loss_metrics_of_sorted_predictions_use_batches_in_input_order():
    features = _toy_features()
    pred = predict(_ToyModel(), _ToyTask(), features, 5, CPU, group_by_length=True)
    means = [
        sum((i + 1) * len(features[i]) for i in range(s, min(s + 4, 23)))
        / sum(len(features[i]) for i in range(s, min(s + 4, 23)))
        for s in range(0, 23, 4)
    ]
    assert loss_metrics(pred, 4)["loss"] == pytest.approx(np.mean(means))


# ------------------------------------------------------------------------------------------------ labels
def test_saved_label_list():
    def config(id2label):
        return BertConfig(vocab_size=10, extra={"id2label": id2label} if id2label is not None else {})

    assert saved_label_list(config({"0": "neg", "1": "pos"})) == ["neg", "pos"]
    assert saved_label_list(config({"1": "b", "0": "a"})) == ["a", "b"]  # by id, not by key order
    assert saved_label_list(config({"0": "LABEL_0", "1": "LABEL_1"})) is None  # transformers' placeholders
    assert saved_label_list(config({"0": "a", "2": "c"})) is None  # ids with a gap
    assert saved_label_list(config(None)) is None and saved_label_list(None) is None
