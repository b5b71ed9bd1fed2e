"""The training loop's pieces (`bert.training`): RNG and checkpoint state, the metrics log, prefetching and the
record stream both runners draw batches from."""

from __future__ import annotations

import json
import random
import threading

import numpy as np
import pytest
import torch

from bert.batching import RecordStream
from bert.checkpointing import (
    TRAINING_STATE_NAME,
    check_checkpoint_config,
    get_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    remove_incomplete,
    set_rng_state,
)
from bert.distributed import DistContext
from bert.errors import InputError
from bert.modeling import BertForPreTraining
from bert.optimization import create_optimizer
from bert.training import MetricsLogger, Trainer, TrainerSettings, prefetch


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_rng_state_round_trip_through_weights_only_load(tmp_path):
    state = get_rng_state()
    first = _draws()
    torch.save({"rng": [state]}, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)  # plain lists, numbers and tensors only
    _draws()
    set_rng_state(loaded["rng"][0])
    assert _draws() == first


def test_checkpoints_saved_atomically_pruned_and_resumable(tmp_path, tiny_config):
    model = BertForPreTraining(tiny_config)
    optimizer, scheduler = create_optimizer(model, 1e-3, 10, 2)
    dist = DistContext(torch.device("cpu"))
    trainer = Trainer(model, model, optimizer, scheduler, dist, tmp_path, TrainerSettings(keep_checkpoint_max=2))
    ids = torch.randint(5, 99, (2, 8))
    for step in range(1, 4):
        out = model(ids, masked_lm_positions=torch.ones(2, 1, dtype=torch.long), masked_lm_ids=ids[:, :1],
                    next_sentence_labels=torch.zeros(2, dtype=torch.long))  # fmt: skip
        out.total_loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        trainer.save_checkpoint(step, {"epoch": 0, "index": step}, {"optimizer": "adamw_bert"})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]  # the oldest was pruned
    assert latest_checkpoint(tmp_path).name == "checkpoint-3"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    (tmp_path / ".checkpoint-9.tmp-x").mkdir()  # an interrupted save is never picked
    (tmp_path / "checkpoint-8").mkdir()  # nor a directory without training state
    assert latest_checkpoint(tmp_path).name == "checkpoint-3"
    remove_incomplete(tmp_path)
    assert not (tmp_path / ".checkpoint-9.tmp-x").exists() and (tmp_path / "checkpoint-3").is_dir()
    info = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())
    assert info["global_step"] == 3 and info["optimizer"] == "adamw_bert"

    # A fresh trainer restored from it continues exactly: same optimizer state and learning rate.
    state = load_training_state(tmp_path / "checkpoint-3")
    assert state["step"] == 3 and state["data"] == {"epoch": 0, "index": 3}
    model2 = BertForPreTraining.from_pretrained(tmp_path / "checkpoint-3")
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), k
    opt2, sched2 = create_optimizer(model2, 1e-3, 10, 2)
    trainer2 = Trainer(model2, model2, opt2, sched2, dist, tmp_path, TrainerSettings())
    trainer2.restore(state)
    assert trainer2.global_step == 3
    assert opt2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    for p, q in zip(model.parameters(), model2.parameters()):
        torch.testing.assert_close(optimizer.state[p]["exp_avg_sq"], opt2.state[q]["exp_avg_sq"], rtol=0, atol=0)


def test_check_checkpoint_config(tmp_path, tiny_config):
    from dataclasses import replace

    model = BertForPreTraining(tiny_config)
    model.save_pretrained(tmp_path)
    check_checkpoint_config(tmp_path, tiny_config)  # same shape: fine
    with pytest.raises(InputError, match=r"num_hidden_layers 2 \(now 3\).*--bert_config_file"):
        check_checkpoint_config(tmp_path, replace(tiny_config, num_hidden_layers=3))


def test_bad_training_state_is_an_input_error(tmp_path):
    (tmp_path / TRAINING_STATE_NAME).write_bytes(b"not a torch file")
    with pytest.raises(InputError, match="delete"):
        load_training_state(tmp_path)


def test_metrics_log_drops_steps_after_the_resumed_checkpoint(tmp_path):
    log = MetricsLogger(tmp_path)
    for step in range(1, 6):
        log.log(step, {"loss": float(step)})
    log.close()
    log = MetricsLogger(tmp_path, start_step=3)
    log.log(4, {"loss": 40.0})
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["loss"]) for m in lines] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_prefetch_keeps_order_and_raises_errors():
    assert list(prefetch(iter(range(10)))) == list(range(10))

    def broken():
        yield 1
        raise ValueError("bad record")

    it = prefetch(broken())
    assert next(it) == 1
    with pytest.raises(ValueError, match="bad record"):
        next(it)


def test_prefetch_pins_batches_in_its_thread(monkeypatch):
    # Pinning needs a GPU build: record where and what Tensor.pin_memory is asked to pin instead.
    pinned = []

    def fake_pin(self):
        pinned.append((threading.current_thread().name, self.clone()))
        return self + 0

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    items = [[{"a": torch.full((2,), i), "n": i}] for i in range(3)]
    out = list(prefetch(iter(items), pin=True))
    assert [b[0]["n"] for b in out] == [0, 1, 2]
    assert all(torch.equal(b[0]["a"], torch.full((2,), i)) for i, b in enumerate(out))
    assert [name for name, _ in pinned] == ["prefetch"] * 3
    assert all(b[0]["a"] is not item[0]["a"] for b, item in zip(out, items))  # the pinned copies are handed on
    assert [b[0]["a"] for b in prefetch(iter(items))] == [item[0]["a"] for item in items]
    assert len(pinned) == 3  # the default never pins


def test_record_stream_epochs_are_seeded_permutations():
    stream = RecordStream(10, seed=7)
    idx, epochs = stream.take(0, 25)  # crosses two epoch boundaries
    assert list(epochs) == [0] * 10 + [1] * 10 + [2] * 5
    assert sorted(idx[:10]) == list(range(10)) and sorted(idx[10:20]) == list(range(10))
    assert list(idx[:10]) != list(idx[10:20])  # reshuffled each epoch
    again, _ = RecordStream(10, seed=7).take(13, 5)  # any position, any instance: the same records
    assert list(again) == list(idx[13:18])
    assert list(RecordStream(10, seed=8).take(0, 10)[0]) != list(idx[:10])
    assert stream.state(23) == {"epoch": 2, "index": 3, "num_records": 10, "seed": 7}
    assert stream.position(2, 3) == 23
    assert list(RecordStream(4, seed=7, shuffle=False).take(2, 4)[0]) == [2, 3, 0, 1]


# ---------------------------------------------------------------------- performance flags, seen at work
def _pretrain_observed(tmp_path, monkeypatch, **flags) -> tuple[int, set[torch.dtype]]:
    """One `bert pretrain` step on synthetic records; returns (runs of the encoder blocks' forward, dtypes the
    Linear layers computed in). The block's forward is counted itself: the recomputation in the backward pass
    does not run module hooks."""
    from bert.commands.pretrain import PretrainArgs, run_pretrain
    from bert.modeling import BertLayer
    from conftest import synthetic_data, write_tiny_config

    tmp_path.mkdir()
    data, vocab = synthetic_data(tmp_path, n=8, seq=32)
    config = write_tiny_config(tmp_path / "config.json", vocab_size=99)
    calls, dtypes = [0], set()
    forward = BertLayer.forward

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return forward(self, *args, **kwargs)

    def record_dtype(module, inputs, output):
        if isinstance(module, torch.nn.Linear):
            dtypes.add(output.dtype)

    monkeypatch.setattr(BertLayer, "forward", counted)
    handle = torch.nn.modules.module.register_module_forward_hook(record_dtype)
    try:
        run_pretrain(
            PretrainArgs(input_file=str(data), output_dir=str(tmp_path / "out"), bert_config_file=str(config),
                         vocab_file=str(vocab), max_seq_length=32, max_predictions_per_seq=5, do_train=True,
                         num_train_steps=1, train_batch_size=4, device="cpu", **flags)
        )  # fmt: skip
    finally:
        handle.remove()
        monkeypatch.undo()
    return calls[0], dtypes


def test_gradient_checkpointing_recomputes_and_bf16_autocast_runs(tmp_path, monkeypatch):
    """--gradient_checkpointing runs each block's forward again in the backward pass; --precision=bf16 makes
    the matrix products compute in bfloat16. Both seen inside a real training step, against the defaults."""
    calls, dtypes = _pretrain_observed(tmp_path / "plain", monkeypatch)
    assert calls > 0 and dtypes == {torch.float32}
    recomputed, dtypes = _pretrain_observed(
        tmp_path / "flags", monkeypatch, gradient_checkpointing=True, precision="bf16"
    )
    assert recomputed == 2 * calls  # each block's forward, and its recomputation during backward
    assert torch.bfloat16 in dtypes
