"""The streaming form of create_pretraining_data (`bert.pretraining.streaming`): its vectorized truncation and
masking against the original's rules, and the buffers documents are dealt into."""

import logging
import random

import numpy as np
import pytest

from bert.pretraining.instances import truncate_seq_pair
from bert.pretraining.streaming import BufferProcessor, GenerationSettings, iter_buffers, truncated_lengths
from conftest import PIECES_VOCAB, PIECES_WORDS


def test_truncated_lengths_match_truncate_seq_pair():
    rng = random.Random(0)
    for la in range(1, 25):
        for lb in range(1, 25):
            for max_tokens in (2, 5, 13, 30):
                a, b = list(range(la)), list(range(lb))
                truncate_seq_pair(a, b, max_tokens, rng)
                got = truncated_lengths(np.array([la]), np.array([lb]), max_tokens)
                assert (int(got[0][0]), int(got[1][0])) == (len(a), len(b)), (la, lb, max_tokens)


def _processor(pieces_vocab_file, tmp_path, wwm=False, max_seq_length=16, max_predictions=4):
    settings = GenerationSettings(
        vocab_file=pieces_vocab_file,
        do_lower_case=True,
        max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions,
        masked_lm_prob=0.15,
        short_seq_prob=0.1,
        dupe_factor=1,
        do_whole_word_mask=wwm,
        random_seed=1,
        output_format="native",
        part_dir=str(tmp_path),
    )
    return BufferProcessor(settings)


@pytest.mark.parametrize("wwm", [False, True])
def test_vectorized_masking_follows_the_original_rules(pieces_vocab_file, tmp_path, wwm):
    proc = _processor(pieces_vocab_file, tmp_path, wwm=wwm, max_seq_length=32, max_predictions=5)
    v = proc.tokenizer.vocab
    rng = np.random.default_rng(0)
    n, T = 3000, 32
    # [CLS] A [SEP] B [SEP] with A = 12 and B = 15 text tokens, many of them "##" pieces
    pool = np.array([v[w] for w in PIECES_WORDS])
    ids = np.zeros((n, T), np.int64)
    ids[:, 1:13] = rng.choice(pool, (n, 12))
    ids[:, 14:29] = rng.choice(pool, (n, 15))
    ids[:, 0], ids[:, 13], ids[:, 29] = v["[CLS]"], v["[SEP]"], v["[SEP]"]
    original = ids.copy()
    candidate = np.zeros((n, T), bool)
    candidate[:, 1:13] = candidate[:, 14:29] = True
    num_tokens = np.full(n, 30)
    positions, labels, num_pred = proc.mask(ids, candidate, num_tokens, rng)

    budget = min(5, max(1, round(30 * 0.15)))  # 4 (round(4.5) is 4: half to even, as Python)
    assert budget == 4
    assert (num_pred <= budget).all()
    if not wwm:
        assert (num_pred == budget).all()
    cont = np.array([t.startswith("##") for t in proc.tokenizer.inv_vocab.values()])[original]
    for i in range(200):
        pos = positions[i, : num_pred[i]]
        assert (np.diff(pos) > 0).all() and candidate[i, pos].all()
        assert (positions[i, num_pred[i] :] == 0).all() and (labels[i, num_pred[i] :] == 0).all()
        np.testing.assert_array_equal(labels[i, : num_pred[i]], original[i, pos])
        unchanged = np.setdiff1d(np.arange(T), pos)
        np.testing.assert_array_equal(ids[i, unchanged], original[i, unchanged])
        if wwm:  # whole words: a chosen "##" piece's word start is chosen, and a chosen word's pieces too
            chosen = set(pos.tolist())
            for p in pos:
                if cont[i, p] and p != 1:
                    prev = p - 1 if p - 1 != 13 else 12  # a B-initial piece joins A's last word
                    assert prev in chosen
                nxt = p + 1 if p + 1 != 13 else 14
                if nxt < 29 and cont[i, nxt]:
                    assert nxt in chosen
    # 80% [MASK], 10% kept, 10% random (a random pick may equal the original)
    valid = np.arange(5)[None, :] < num_pred[:, None]
    at = np.take_along_axis(ids, positions, axis=1)[valid]
    frac_mask = (at == v["[MASK]"]).mean()
    frac_kept = (at == labels[valid]).mean()
    assert abs(frac_mask - 0.8) < 0.02
    assert abs(frac_kept - (0.1 + 0.1 / len(PIECES_VOCAB))) < 0.02


def test_iter_buffers_deal_every_document_once_and_cut_long_ones(tmp_path, caplog):
    a = tmp_path / "a.txt"
    a.write_text("".join(f"doc{i} line1\ndoc{i} line2\n\n" for i in range(40)))
    b = tmp_path / "b.txt"
    b.write_text("".join(f"long line {i}\n" for i in range(100)))  # one document, no blank line
    with caplog.at_level(logging.WARNING):
        buffers = list(iter_buffers([str(a), str(b)], buffer_chars=200, random_seed=1))
    lines = [line for buf in buffers for line in buf.lines]
    assert sorted(lines) == sorted(
        [f"doc{i} line{j}" for i in range(40) for j in (1, 2)] + [f"long line {i}" for i in range(100)]
    )
    # a buffer overshoots by at most one document, and documents are cut at the buffer size
    assert all(buf.chars < 2 * 200 + 20 for buf in buffers)
    assert all(sum(buf.doc_lines) == len(buf.lines) for buf in buffers)
    assert "no blank line" in caplog.text and "cut into pieces" in caplog.text
    again = list(iter_buffers([str(a), str(b)], buffer_chars=200, random_seed=1))
    assert [x.lines for x in again] == [x.lines for x in buffers]
    # documents are dealt at random into the open buffers: the first buffer is not the first documents
    assert buffers[0].lines[:4] != ["doc0 line1", "doc0 line2", "doc1 line1", "doc1 line2"]
