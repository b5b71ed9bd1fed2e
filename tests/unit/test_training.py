"""The training loop's pieces: RNG and checkpoint state, TensorBoard files, data order, dynamic masking."""

from __future__ import annotations

import dataclasses
import json
import random
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.errors import InputError
from bert.formats.tensorboard import EventWriter, encode_scalar_value, read_events, read_scalars
from bert.modeling import BertForPreTraining
from bert.optimization import create_optimizer
from bert.pretraining.inputs import (
    MaskingVocab,
    dynamic_mask,
    masking_vocab,
    open_pretraining_data,
    rank_batches,
    restore_original_tokens,
    whole_word_positions,
)
from bert.training import (
    TRAINING_STATE_NAME,
    DistContext,
    MetricsLogger,
    RecordStream,
    Trainer,
    TrainerSettings,
    check_checkpoint_config,
    get_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    prefetch,
    remove_incomplete,
    set_rng_state,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "fixtures" / "pretraining_tfrecord" / "sample_text_nowwm.tfrecord"
SAMPLE_JSONL = SAMPLE.with_suffix(".jsonl")
UNCASED = MaskingVocab(vocab_size=30522, cls_id=101, sep_id=102, mask_id=103)  # bert-base-uncased ids


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


def test_tensorboard_event_file(tmp_path):
    # The hand-encoded Summary.Value: tag (field 1, length-delimited) and simple_value (field 2, fixed32).
    assert encode_scalar_value("loss", 1.0) == b"\x0a\x04loss\x15" + struct.pack("<f", 1.0)
    with EventWriter(tmp_path) as w:
        w.add_scalars(1, {"loss": 2.5, "learning_rate": 1e-4}, wall_time=100.0)
        w.add_scalars(2, {"loss": 1.25})
    events = read_events(w.path)  # bert.formats.tfrecord checks every length and data CRC
    assert w.path.name.startswith("events.out.tfevents.")
    assert events[0]["file_version"] == "brain.Event:2"
    assert events[1] == {"wall_time": 100.0, "step": 1, "scalars": {"loss": 2.5, "learning_rate": np.float32(1e-4)}}
    assert read_scalars(tmp_path) == {"loss": [(1, 2.5), (2, 1.25)], "learning_rate": [(1, np.float32(1e-4))]}


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


def test_whole_word_positions_take_whole_words():
    # Pieces at 1,2 form one word ("##" at 2); 6 is "##" but follows a gap (a [SEP] at 5): its own word.
    candidates = np.array([1, 2, 3, 4, 6, 7])
    continuation = np.array([False, True, False, False, True, False])
    words = [{1, 2}, {3}, {4}, {6}, {7}]
    seen = set()
    for seed in range(50):
        got = whole_word_positions(candidates, continuation, 3, np.random.default_rng(seed))
        assert list(got) == sorted(got) and len(got) <= 3
        assert all(w <= set(got) or not (w & set(got)) for w in words)
        seen.add(tuple(got))
    assert len(got) == 3 and len(seen) > 5
    vocab = masking_vocab({"[CLS]": 0, "[SEP]": 1, "[MASK]": 2, "a": 3, "##b": 4}, "vocab.txt", whole_word=True)
    assert vocab.continuation.tolist() == [False, False, False, False, True]
    assert masking_vocab({"[CLS]": 0, "[SEP]": 1, "[MASK]": 2}, "vocab.txt", whole_word=False).continuation is None


def test_whole_word_dynamic_masking():
    records = [json.loads(line) for line in SAMPLE_JSONL.read_text().splitlines()]
    continuation = np.zeros(UNCASED.vocab_size, bool)
    for r in records:
        for ids, tokens in ((r["input_ids"], r["tokens"]), (r["masked_lm_ids"], r["masked_lm_tokens"])):
            for i, t in zip(ids, tokens):
                continuation[i] |= t.startswith("##")
    source = open_pretraining_data(str(SAMPLE), 128, 20, None)
    indices = np.arange(len(source))
    features = source.get_batch(indices)
    original = restore_original_tokens(features)
    counts = (features["masked_lm_weights"] > 0).sum(1)
    # A "##" piece is masked exactly when the piece before it is: single-piece masking splits words.
    follows = continuation[original[:, 1:]] & ~np.isin(original[:, :-1], [UNCASED.cls_id, UNCASED.sep_id])
    split = {}
    for name, vocab in (("pieces", UNCASED), ("words", dataclasses.replace(UNCASED, continuation=continuation))):
        split[name] = 0
        for epoch in range(3):
            new = dynamic_mask(features, indices, np.full(len(indices), epoch), 12345, vocab)
            w = new["masked_lm_weights"] > 0
            masked = np.zeros_like(original, dtype=bool)
            for b in range(len(indices)):
                masked[b, new["masked_lm_positions"][b, w[b]]] = True
            assert (w.sum(1) <= counts).all() and w.sum() > 0.9 * counts.sum() and w.any(1).all()
            assert np.array_equal(new["masked_lm_ids"][w], original[np.nonzero(w)[0], new["masked_lm_positions"][w]])
            split[name] += int((follows & (masked[:, 1:] != masked[:, :-1])).sum())
    assert split["words"] == 0 and split["pieces"] > 0


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


def test_ranks_split_the_global_batch():
    source = open_pretraining_data(str(SAMPLE), 128, 20, None)
    stream = RecordStream(len(source), seed=1)
    whole = next(rank_batches(source, stream, 5, 8, 0, 1, 1))[0]
    parts = [next(rank_batches(source, stream, 5, 8, r, 2, 2)) for r in range(2)]
    assert all(len(p) == 2 and len(p[0]["input_ids"]) == 2 for p in parts)  # 2 ranks x 2 micro-batches of 2
    for key, value in whole.items():
        assert torch.equal(torch.cat([mb[key] for p in parts for mb in p]), value), key
    assert whole["attention_mask"].dtype == torch.int64 and whole["next_sentence_labels"].shape == (8,)


def test_restore_original_tokens_matches_the_records():
    source = open_pretraining_data(str(SAMPLE), 128, 20, None)
    features = source.get_batch(np.arange(len(source)))
    restored = restore_original_tokens(features)
    assert (features["input_ids"] == UNCASED.mask_id).sum() == 271  # the fixture's [MASK] count
    assert (restored == UNCASED.mask_id).sum() == 0  # every [MASK] put back
    w = features["masked_lm_weights"] > 0
    rows = np.broadcast_to(np.arange(len(restored))[:, None], w.shape)
    assert np.array_equal(restored[rows[w], features["masked_lm_positions"][w]], features["masked_lm_ids"][w])
    changed = restored != features["input_ids"]
    assert changed.sum() <= w.sum()  # only predicted positions change (kept ones stay equal)
    records = [json.loads(line) for line in SAMPLE_JSONL.read_text().splitlines()]
    assert np.array_equal(features["input_ids"][0], records[0]["input_ids"])


def test_dynamic_masking():
    source = open_pretraining_data(str(SAMPLE), 128, 20, None)
    indices = np.arange(len(source))
    features = source.get_batch(indices)
    original = restore_original_tokens(features)
    epochs = np.zeros(len(indices), dtype=np.int64)
    new = dynamic_mask(features, indices, epochs, 12345, UNCASED)
    w = new["masked_lm_weights"] > 0
    assert np.array_equal(w.sum(1), (features["masked_lm_weights"] > 0).sum(1))  # as many as each record had
    for b in range(len(indices)):
        n = int(w[b].sum())
        pos = new["masked_lm_positions"][b, :n]
        assert list(pos) == sorted(set(pos))
        assert new["input_mask"][b, pos].all()
        assert not np.isin(original[b, pos], [UNCASED.cls_id, UNCASED.sep_id]).any()
        assert np.array_equal(new["masked_lm_ids"][b, :n], original[b, pos])  # labels are the original tokens
        assert not new["masked_lm_positions"][b, n:].any() and not new["masked_lm_ids"][b, n:].any()
        outside = np.ones(128, bool)
        outside[pos] = False
        assert np.array_equal(new["input_ids"][b, outside], original[b, outside])
    # Other features untouched; the draw depends on (seed, epoch, index) only, not on the batch.
    assert new["segment_ids"] is features["segment_ids"]
    one = dynamic_mask(source.get_batch(indices[3:4]), indices[3:4], epochs[3:4], 12345, UNCASED)
    assert np.array_equal(one["input_ids"][0], new["input_ids"][3])
    other_epoch = dynamic_mask(features, indices, epochs + 1, 12345, UNCASED)
    assert not np.array_equal(other_epoch["masked_lm_positions"], new["masked_lm_positions"])
    # 80% [MASK], 10% kept, 10% random, over many draws.
    masked = kept = total = 0
    for epoch in range(20):
        d = dynamic_mask(features, indices, epochs + epoch, 1, UNCASED)
        m = d["masked_lm_weights"] > 0
        rows = np.broadcast_to(np.arange(len(indices))[:, None], m.shape)
        got = d["input_ids"][rows[m], d["masked_lm_positions"][m]]
        masked += int((got == UNCASED.mask_id).sum())
        kept += int((got == d["masked_lm_ids"][m]).sum())
        total += int(m.sum())
    assert masked / total == pytest.approx(0.8, abs=0.03)
    assert kept / total == pytest.approx(0.1, abs=0.03)
