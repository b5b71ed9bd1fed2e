"""create-pretraining-data: the vectorized streaming pieces against the original's rules, statistics on a
real book, determinism, the native format and its manifest checks, and bad input."""

import gzip
import json
import logging
import random

import numpy as np
import pytest

from bert.cli import main
from bert.commands.create_pretraining_data import CreatePretrainingDataArgs, run_create_pretraining_data
from bert.errors import InputError
from bert.formats.native import (
    NativeShardWriter,
    check_manifest,
    open_native_dataset,
    record_dtype,
    records_to_features,
)
from bert.formats.tfrecord import PRETRAINING_FEATURES, encode_example, encode_pretraining_examples, read_examples
from bert.pretraining.instances import create_masked_lm_predictions, truncate_seq_pair
from bert.pretraining.streaming import BufferProcessor, GenerationSettings, iter_buffers, truncated_lengths
from conftest import shared_path

# A tiny vocab: specials, some words, and "##" pieces for whole-word masking.
WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "un", "##able", "##s", "##ing", "walk", "."]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return str(path)


def _write_corpus(path, n_docs=30, seed=0):
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "unable", "walking", "cats"]
    docs = []
    for _ in range(n_docs):
        sents = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))) + " ." for _ in range(8)]
        docs.append("\n".join(sents))
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def _args(input_file, output_file, vocab_file, **kw):
    return CreatePretrainingDataArgs(
        input_file=input_file, output_file=output_file, vocab_file=vocab_file, **{"dupe_factor": 2, **kw}
    )


# --- vectorized pieces vs the original's functions ----------------------------------------------------------


def test_truncated_lengths_match_truncate_seq_pair():
    rng = random.Random(0)
    for la in range(1, 25):
        for lb in range(1, 25):
            for max_tokens in (2, 5, 13, 30):
                a, b = list(range(la)), list(range(lb))
                truncate_seq_pair(a, b, max_tokens, rng)
                got = truncated_lengths(np.array([la]), np.array([lb]), max_tokens)
                assert (int(got[0][0]), int(got[1][0])) == (len(a), len(b)), (la, lb, max_tokens)


def test_encode_pretraining_examples_is_byte_identical_to_encode_example():
    rng = np.random.default_rng(0)
    n = 50
    feats = {
        "input_ids": rng.integers(0, 30522, (n, 16)),
        "input_mask": rng.integers(0, 2, (n, 16)),
        "segment_ids": rng.integers(0, 2, (n, 16)),
        "masked_lm_positions": rng.integers(0, 16, (n, 4)),
        "masked_lm_ids": rng.integers(0, 2**40, (n, 4)),  # multi-byte varints, up to 6 bytes
        "masked_lm_weights": rng.random((n, 4)).astype(np.float32),
        "next_sentence_labels": rng.integers(0, 2, (n, 1)),
    }
    feats["input_ids"][0] = 0
    fast = encode_pretraining_examples(feats)
    assert fast == [
        encode_example({k: feats[k][i] for k in PRETRAINING_FEATURES}, PRETRAINING_FEATURES) for i in range(n)
    ]


def _processor(vocab_file, tmp_path, wwm=False, max_seq_length=16, max_predictions=4):
    settings = GenerationSettings(
        vocab_file=vocab_file,
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
def test_vectorized_masking_follows_the_original_rules(vocab_file, tmp_path, wwm):
    proc = _processor(vocab_file, tmp_path, wwm=wwm, max_seq_length=32, max_predictions=5)
    v = proc.tokenizer.vocab
    rng = np.random.default_rng(0)
    n, T = 3000, 32
    # [CLS] A [SEP] B [SEP] with A = 12 and B = 15 text tokens, many of them "##" pieces
    pool = np.array([v[w] for w in WORDS])
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
    assert abs(frac_kept - (0.1 + 0.1 / len(VOCAB))) < 0.02


def test_original_masking_wwm_groups_pieces_across_sep():
    # The quirk the streaming mode keeps: a "##" piece starting B joins the last word of A.
    tokens = ["[CLS]", "walk", "[SEP]", "##ing", "[SEP]"]
    _, positions, _ = create_masked_lm_predictions(tokens, 0.5, 5, VOCAB, random.Random(3), do_whole_word_mask=True)
    assert positions == [1, 3]  # one group of 2 = the whole budget round(5 * 0.5)


# --- statistics on a real book ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def book_corpus(tmp_path_factory):
    """The first ~200 KB of Jane Austen's Emma through prepare-corpus, split at chapters."""
    pytest.importorskip("pysbd")
    from bert.commands.prepare_corpus import PrepareCorpusArgs, run_prepare_corpus

    src = shared_path("data", "corpus", "nltk_gutenberg", "austen-emma.txt.gz")
    tmp = tmp_path_factory.mktemp("book")
    raw = gzip.decompress(src.read_bytes())[:200_000]
    (tmp / "emma.txt.gz").write_bytes(gzip.compress(raw[: raw.rfind(b"\n\n")]))
    out = tmp / "emma_sentences.txt"
    result = run_prepare_corpus(
        PrepareCorpusArgs(input_file=str(tmp / "emma.txt.gz"), output_file=str(out), split_chapters=True)
    )
    assert result["documents"] >= 10
    return str(out)


@pytest.fixture(scope="module")
def real_vocab():
    return str(shared_path("data", "vocab", "uncased.txt"))


@pytest.mark.parametrize("streaming", [False, True])
def test_statistics_on_a_book(book_corpus, real_vocab, tmp_path, streaming):
    stats = run_create_pretraining_data(
        _args(book_corpus, str(tmp_path / "out"), real_vocab, dupe_factor=3, streaming=streaming)
    )
    assert stats["instances"] > 1000
    assert abs(stats["fraction_tokens_predicted"] - 0.15) < 0.01  # round(0.15 * 128) = 19 of 128
    mask, keep, rand = stats["fraction_mask_keep_random"]
    assert abs(mask - 0.8) < 0.02 and abs(keep - 0.1) < 0.02 and abs(rand - 0.1) < 0.02
    assert 0.45 < stats["fraction_random_next"] < 0.62
    assert stats["mean_tokens_per_instance"] > 110  # most instances fill the 128 tokens
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert on_disk["instances"] == stats["instances"]


def test_streaming_and_compat_agree_statistically(book_corpus, real_vocab, tmp_path):
    runs = [
        run_create_pretraining_data(_args(book_corpus, str(tmp_path / f"o{s}"), real_vocab, dupe_factor=4, streaming=s))
        for s in (False, True)
    ]
    compat, stream = runs
    assert compat["documents"] == stream["documents"] and compat["text_tokens"] == stream["text_tokens"]
    assert abs(compat["instances"] - stream["instances"]) / compat["instances"] < 0.05
    assert abs(compat["mean_tokens_per_instance"] - stream["mean_tokens_per_instance"]) < 3
    assert abs(compat["fraction_random_next"] - stream["fraction_random_next"]) < 0.05


# --- streaming: determinism, buffers --------------------------------------------------------------------------


def _read_all(path):
    return [{k: v.tolist() for k, v in r.items()} for r in read_examples(path)]


def test_streaming_is_deterministic_for_a_seed_and_any_worker_count(tmp_path, vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt")
    out = {}
    for name, seed, workers in (("a", 7, 1), ("b", 7, 1), ("c", 7, 2), ("d", 8, 1)):
        path = tmp_path / f"{name}.tfrecord"
        run_create_pretraining_data(
            _args(corpus, str(path), vocab_file, max_seq_length=24, max_predictions_per_seq=4, random_seed=seed,
                  streaming=True, num_workers=workers, streaming_buffer_mb=0.002)
        )  # fmt: skip
        out[name] = _read_all(path)
    assert len(out["a"]) > 20
    assert out["a"] == out["b"] == out["c"]
    assert out["a"] != out["d"]
    stats = json.loads((tmp_path / "c.tfrecord.stats.json").read_text())
    assert stats["mode"] == "streaming" and stats["instances"] == len(out["c"])


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


# --- native format ------------------------------------------------------------------------------------------


def test_native_streaming_round_trip_and_manifest(tmp_path, vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt")
    common = dict(max_seq_length=24, max_predictions_per_seq=4, streaming=True, streaming_buffer_mb=0.002)
    run_create_pretraining_data(_args(corpus, str(tmp_path / "n"), vocab_file, **common))
    run_create_pretraining_data(_args(corpus, str(tmp_path / "t.tfrecord"), vocab_file, **common))
    manifest, records = open_native_dataset(tmp_path / "n")
    assert len(manifest["shards"]) > 1 and manifest["total_instances"] == len(records)
    for key in ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "do_whole_word_mask", "dupe_factor",
                "short_seq_prob", "random_seed", "do_lower_case", "vocab_sha256", "vocab_size", "num_workers",
                "streaming", "format_version"):  # fmt: skip
        assert key in manifest, key
    assert manifest["streaming"] is True and manifest["vocab_size"] == len(VOCAB)
    assert np.load(tmp_path / "n" / manifest["shards"][0]["file"], mmap_mode="r").dtype == record_dtype(24, 4, 19)
    tf = _read_all(tmp_path / "t.tfrecord")
    batch = records.get_batch(np.arange(len(records)))
    assert len(tf) == len(records)
    for key in PRETRAINING_FEATURES:
        np.testing.assert_array_equal(batch[key].reshape(len(tf), -1), [r[key] for r in tf], err_msg=key)
    one = records[len(records) - 1]
    assert one["input_ids"].shape == (24,) and one["next_sentence_labels"].shape == (1,)
    assert (tmp_path / "n" / "args.json").is_file() and (tmp_path / "n" / "stats.json").is_file()


def test_check_manifest_names_the_flag_and_the_value(tmp_path, vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt", n_docs=5)
    run_create_pretraining_data(_args(corpus, str(tmp_path / "n"), vocab_file, max_seq_length=24,
                                      max_predictions_per_seq=4))  # fmt: skip
    manifest, _ = open_native_dataset(tmp_path / "n")
    check_manifest(manifest, max_seq_length=24, max_predictions_per_seq=4, vocab_file=vocab_file, do_lower_case=True)
    with pytest.raises(InputError, match=r"--max_seq_length=128 .* max_seq_length=24; pass --max_seq_length=24"):
        check_manifest(manifest, max_seq_length=128)
    with pytest.raises(InputError, match=r"--max_predictions_per_seq=20 .*max_predictions_per_seq=4"):
        check_manifest(manifest, max_predictions_per_seq=20)
    with pytest.raises(InputError, match=r"--do_lower_case=False .*do_lower_case=True"):
        check_manifest(manifest, do_lower_case=False)
    other = tmp_path / "other_vocab.txt"
    other.write_text("\n".join([*VOCAB, "extra"]) + "\n")
    with pytest.raises(InputError, match=r"--vocab_file=.*other_vocab.txt .*not the vocabulary.*19 tokens"):
        check_manifest(manifest, vocab_file=str(other))


def test_native_writer_replaces_a_dataset_but_not_other_directories(tmp_path):
    dtype = record_dtype(8, 2, 100)
    recs = np.zeros(5, dtype)
    recs["num_tokens"] = 5
    target = tmp_path / "ds"
    for count in (5, 3):
        with NativeShardWriter(target, 8, 2, 100, shard_size=2) as w:
            w.write(recs[:count])
            w.close({"max_seq_length": 8, "max_predictions_per_seq": 2})
    manifest, records = open_native_dataset(target)
    assert len(records) == 3 and [s["num_instances"] for s in manifest["shards"]] == [2, 1]
    assert records_to_features(records.records([0]))["input_mask"].tolist() == [[1] * 5 + [0] * 3]
    # an exception inside the block leaves the old dataset and no temporary directory
    with pytest.raises(RuntimeError), NativeShardWriter(target, 8, 2, 100) as w:
        w.write(recs)
        raise RuntimeError("boom")
    assert len(open_native_dataset(target)[1]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="not empty"):
        NativeShardWriter(tmp_path / "mine", 8, 2, 100)
    with pytest.raises(InputError, match=r"no manifest\.json"):
        open_native_dataset(tmp_path / "mine")


# --- bad input ----------------------------------------------------------------------------------------------


def _run_cli(capsys, *flags):
    code = main(["create-pretraining-data", *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_glob_matching_nothing(tmp_path, capsys, vocab_file):
    code, err = _run_cli(capsys, f"--input_file={tmp_path}/nothing*.txt", f"--output_file={tmp_path}/o.tfrecord",
                         f"--vocab_file={vocab_file}")  # fmt: skip
    assert code == 2 and "nothing matches" in err


@pytest.mark.parametrize("output", ["o.tfrecord", "native_dir"])
def test_empty_corpus_writes_nothing(tmp_path, capsys, vocab_file, output):
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    for streaming in ("false", "true"):
        code, err = _run_cli(capsys, f"--input_file={tmp_path}/empty.txt", f"--output_file={tmp_path}/{output}",
                             f"--vocab_file={vocab_file}", f"--streaming={streaming}")  # fmt: skip
        assert code == 2 and "the corpus is empty" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "vocab.txt"]


def test_invalid_utf8_names_file_and_line_unless_ignored(tmp_path, capsys, vocab_file):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"the cat sat .\nthe dog \xff ran .\n\nthe mat .\non the mat .\n")
    flags = [f"--input_file={corpus}", f"--output_file={tmp_path}/o.tfrecord", f"--vocab_file={vocab_file}"]
    code, err = _run_cli(capsys, *flags)
    assert code == 2 and "c.txt:2: " in err and "--decode_errors=ignore" in err
    assert not (tmp_path / "o.tfrecord").exists()
    code, _ = _run_cli(capsys, *flags, "--decode_errors=ignore")  # the original's behaviour: bytes dropped
    assert code == 0 and len(list(read_examples(tmp_path / "o.tfrecord"))) > 0


def test_vocab_without_special_tokens(tmp_path, capsys):
    vocab = tmp_path / "v.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    corpus = _write_corpus(tmp_path / "c.txt", n_docs=2)
    code, err = _run_cli(capsys, f"--input_file={corpus}", f"--output_file={tmp_path}/o.tfrecord",
                         f"--vocab_file={vocab}")  # fmt: skip
    assert code == 2 and "has no [MASK]" in err


def test_file_without_document_breaks_warns_and_is_one_document(tmp_path, vocab_file, caplog):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join("the cat sat on the mat .\n" for _ in range(20)))
    with caplog.at_level(logging.WARNING):
        stats = run_create_pretraining_data(_args(str(corpus), str(tmp_path / "o.tfrecord"), vocab_file))
    assert "has no blank line" in caplog.text
    assert stats["documents"] == 1 and stats["instances"] > 0


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--max_seq_length=4", "--max_seq_length=4 is too small"),
        ("--masked_lm_prob=1.5", "--masked_lm_prob=1.5 is a probability"),
        ("--dupe_factor=0", "--dupe_factor=0 must be at least 1"),
        ("--num_workers=0", "--num_workers=0 must be at least 1"),
    ],
)
def test_bad_flags_are_refused_before_any_work(tmp_path, capsys, vocab_file, flag, message):
    corpus = _write_corpus(tmp_path / "c.txt", n_docs=2)
    code, err = _run_cli(capsys, f"--input_file={corpus}", f"--output_file={tmp_path}/o", f"--vocab_file={vocab_file}",
                         flag)  # fmt: skip
    assert code == 2 and message in err


def test_native_output_into_a_foreign_directory_is_refused(tmp_path, capsys, vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt", n_docs=2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("precious")
    code, err = _run_cli(
        capsys, f"--input_file={corpus}", f"--output_file={tmp_path}/out", f"--vocab_file={vocab_file}"
    )
    assert code == 2 and "not empty" in err
    assert (tmp_path / "out" / "thesis.tex").read_text() == "precious"
