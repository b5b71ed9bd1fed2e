"""`bert create-pretraining-data` and its writer `bert.pretraining.create`: statistics on a real book in both
modes, determinism, the native output and its manifest, and bad input. The streaming pieces are tested in
test_pretraining_streaming.py, the native format in test_native.py."""

import gzip
import json
import logging
import random

import numpy as np
import pytest

from bert.cli import main
from bert.commands.create_pretraining_data import CreatePretrainingDataArgs, run_create_pretraining_data
from bert.errors import InputError
from bert.formats.native import check_manifest, open_native_dataset, record_dtype
from bert.formats.tfrecord import PRETRAINING_FEATURES, read_examples
from conftest import PIECES_VOCAB, shared_path


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


# --- streaming: determinism ----------------------------------------------------------------------------------


def _read_all(path):
    return [{k: v.tolist() for k, v in r.items()} for r in read_examples(path)]


def test_streaming_is_deterministic_for_a_seed_and_any_worker_count(tmp_path, pieces_vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt")
    out = {}
    for name, seed, workers in (("a", 7, 1), ("b", 7, 1), ("c", 7, 2), ("d", 8, 1)):
        path = tmp_path / f"{name}.tfrecord"
        run_create_pretraining_data(
            _args(corpus, str(path), pieces_vocab_file, max_seq_length=24, max_predictions_per_seq=4, random_seed=seed,
                  streaming=True, num_workers=workers, streaming_buffer_mb=0.002)
        )  # fmt: skip
        out[name] = _read_all(path)
    assert len(out["a"]) > 20
    assert out["a"] == out["b"] == out["c"]
    assert out["a"] != out["d"]
    stats = json.loads((tmp_path / "c.tfrecord.stats.json").read_text())
    assert stats["mode"] == "streaming" and stats["instances"] == len(out["c"])


# --- native format ------------------------------------------------------------------------------------------


def test_native_streaming_round_trip_and_manifest(tmp_path, pieces_vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt")
    common = dict(max_seq_length=24, max_predictions_per_seq=4, streaming=True, streaming_buffer_mb=0.002)
    run_create_pretraining_data(_args(corpus, str(tmp_path / "n"), pieces_vocab_file, **common))
    run_create_pretraining_data(_args(corpus, str(tmp_path / "t.tfrecord"), pieces_vocab_file, **common))
    manifest, records = open_native_dataset(tmp_path / "n")
    assert len(manifest["shards"]) > 1 and manifest["total_instances"] == len(records)
    for key in ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "do_whole_word_mask", "dupe_factor",
                "short_seq_prob", "random_seed", "do_lower_case", "vocab_sha256", "vocab_size", "num_workers",
                "streaming", "format_version"):  # fmt: skip
        assert key in manifest, key
    assert manifest["streaming"] is True and manifest["vocab_size"] == len(PIECES_VOCAB)
    assert np.load(tmp_path / "n" / manifest["shards"][0]["file"], mmap_mode="r").dtype == record_dtype(24, 4, 19)
    tf = _read_all(tmp_path / "t.tfrecord")
    batch = records.get_batch(np.arange(len(records)))
    assert len(tf) == len(records)
    for key in PRETRAINING_FEATURES:
        np.testing.assert_array_equal(batch[key].reshape(len(tf), -1), [r[key] for r in tf], err_msg=key)
    one = records[len(records) - 1]
    assert one["input_ids"].shape == (24,) and one["next_sentence_labels"].shape == (1,)
    assert json.loads((tmp_path / "n" / "args.json").read_text())["command"] == "create-pretraining-data"
    assert json.loads((tmp_path / "n" / "stats.json").read_text())["instances"] == len(records)


def test_check_manifest_names_the_flag_and_the_value(tmp_path, pieces_vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt", n_docs=5)
    run_create_pretraining_data(_args(corpus, str(tmp_path / "n"), pieces_vocab_file, max_seq_length=24,
                                      max_predictions_per_seq=4))  # fmt: skip
    manifest, _ = open_native_dataset(tmp_path / "n")
    check_manifest(
        manifest, max_seq_length=24, max_predictions_per_seq=4, vocab_file=pieces_vocab_file, do_lower_case=True
    )
    with pytest.raises(InputError, match=r"--max_seq_length=128 .* max_seq_length=24; pass --max_seq_length=24"):
        check_manifest(manifest, max_seq_length=128)
    with pytest.raises(InputError, match=r"--max_predictions_per_seq=20 .*max_predictions_per_seq=4"):
        check_manifest(manifest, max_predictions_per_seq=20)
    with pytest.raises(InputError, match=r"--do_lower_case=False .*do_lower_case=True"):
        check_manifest(manifest, do_lower_case=False)
    other = tmp_path / "other_vocab.txt"
    other.write_text("\n".join([*PIECES_VOCAB, "extra"]) + "\n")
    with pytest.raises(InputError, match=r"--vocab_file=.*other_vocab.txt .*not the vocabulary.*19 tokens"):
        check_manifest(manifest, vocab_file=str(other))


# --- bad input ----------------------------------------------------------------------------------------------


def _run_cli(capsys, *flags):
    code = main(["create-pretraining-data", *flags])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_glob_matching_nothing(tmp_path, capsys, pieces_vocab_file):
    code, err = _run_cli(capsys, f"--input_file={tmp_path}/nothing*.txt", f"--output_file={tmp_path}/o.tfrecord",
                         f"--vocab_file={pieces_vocab_file}")  # fmt: skip
    assert code == 2 and "nothing matches" in err


@pytest.mark.parametrize("output", ["o.tfrecord", "native_dir"])
def test_empty_corpus_writes_nothing(tmp_path, capsys, pieces_vocab_file, output):
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    for streaming in ("false", "true"):
        code, err = _run_cli(capsys, f"--input_file={tmp_path}/empty.txt", f"--output_file={tmp_path}/{output}",
                             f"--vocab_file={pieces_vocab_file}", f"--streaming={streaming}")  # fmt: skip
        assert code == 2 and "the corpus is empty" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "vocab.txt"]


def test_invalid_utf8_names_file_and_line_unless_ignored(tmp_path, capsys, pieces_vocab_file):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"the cat sat .\nthe dog \xff ran .\n\nthe mat .\non the mat .\n")
    flags = [f"--input_file={corpus}", f"--output_file={tmp_path}/o.tfrecord", f"--vocab_file={pieces_vocab_file}"]
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


def test_file_without_document_breaks_warns_and_is_one_document(tmp_path, pieces_vocab_file, caplog):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join("the cat sat on the mat .\n" for _ in range(20)))
    with caplog.at_level(logging.WARNING):
        stats = run_create_pretraining_data(_args(str(corpus), str(tmp_path / "o.tfrecord"), pieces_vocab_file))
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
def test_bad_flags_are_refused_before_any_work(tmp_path, capsys, pieces_vocab_file, flag, message):
    corpus = _write_corpus(tmp_path / "c.txt", n_docs=2)
    code, err = _run_cli(capsys, f"--input_file={corpus}", f"--output_file={tmp_path}/o",
                         f"--vocab_file={pieces_vocab_file}", flag)  # fmt: skip
    assert code == 2 and message in err


def test_native_output_into_a_foreign_directory_is_refused(tmp_path, capsys, pieces_vocab_file):
    corpus = _write_corpus(tmp_path / "c.txt", n_docs=2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("precious")
    code, err = _run_cli(
        capsys, f"--input_file={corpus}", f"--output_file={tmp_path}/out", f"--vocab_file={pieces_vocab_file}"
    )
    assert code == 2 and "not empty" in err
    assert (tmp_path / "out" / "thesis.tex").read_text() == "precious"
