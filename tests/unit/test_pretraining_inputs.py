"""What pre-training reads (`bert.pretraining.inputs`): records from TFRecord or native files, dynamic masking
(single pieces and whole words), the original tokens under the masks, and the global batch split over ranks."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from bert.batching import RecordStream
from bert.pretraining.inputs import (
    MaskingVocab,
    dynamic_mask,
    masking_vocab,
    open_pretraining_data,
    rank_batches,
    restore_original_tokens,
    whole_word_positions,
)
from conftest import FIXTURES

SAMPLE = FIXTURES / "pretraining_tfrecord" / "sample_text_nowwm.tfrecord"
SAMPLE_JSONL = SAMPLE.with_suffix(".jsonl")
UNCASED = MaskingVocab(vocab_size=30522, cls_id=101, sep_id=102, mask_id=103)  # bert-base-uncased ids


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
