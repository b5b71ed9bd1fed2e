"""`bert build-vocab` and `bert.vocab`: the released layout, a vocab the original's WordPiece uses without
[UNK] on the words it was learned from, reproducible builds, bad input, and quality on real books."""

from __future__ import annotations

import collections
import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bert.cli import main as cli_main
from bert.commands.build_vocab import BuildVocabArgs, run_build_vocab, stats_path
from bert.errors import InputError
from bert.tokenization import BasicTokenizer, FullTokenizer, load_vocab
from bert.vocab import _feed, build_vocab, can_continue, choose_alphabet, count_words, coverage, vocab_layout
from conftest import FIXTURES, cli_error, shared_path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _uncased_vocab() -> list[str]:
    data = gzip.decompress((FIXTURES / "tokenization" / "vocab_uncased.txt.gz").read_bytes()).decode("utf-8")
    return data.splitlines()


def _write_corpus(path: Path, n_docs: int = 40, seed: int = 0) -> Path:
    """Sentences of made-up words over a small alphabet, with accents, capitals, digits and punctuation."""
    rng = random.Random(seed)
    stems = ["walk", "talk", "run", "jump", "read", "writ", "sing", "danc", "éclair", "naïv", "Zoë", "Straße"]
    endings = ["", "s", "ed", "ing", "er", "ers", "able", "ness"]
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(3, 8)):
            words = [rng.choice(stems) + rng.choice(endings) for _ in range(rng.randint(4, 12))]
            words[0] = words[0].capitalize()
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 2000)))
            sentences.append(" ".join(words) + rng.choice([".", "!", "?", ", said he."]))
        docs.append("\n".join(sentences))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path) -> Path:
    return _write_corpus(tmp_path / "corpus.txt")


def _args(input_file, output_file, **kw) -> BuildVocabArgs:
    return BuildVocabArgs(input_file=str(input_file), output_file=str(output_file), **{"vocab_size": 300, **kw})


# --- layout --------------------------------------------------------------------------------------------------


def test_layout_matches_the_released_vocab():
    released = _uncased_vocab()
    layout = vocab_layout(99)
    assert layout == released[:104]
    assert [layout.index(t) for t in SPECIALS] == [0, 100, 101, 102, 103]
    # 994 unused tokens: the uncased file's first 999 ids exactly (895 of them after [MASK]).
    assert vocab_layout(994) == released[:999]
    assert released[999] == "!"  # where its pieces begin
    assert vocab_layout(0) == SPECIALS
    assert vocab_layout(5) == ["[PAD]", *(f"[unused{i}]" for i in range(5)), *SPECIALS[1:]]


def test_vocab_file_layout_ids_and_tokenizer(corpus, tmp_path):
    out = tmp_path / "out" / "vocab.txt"
    result = run_build_vocab(_args(corpus, out, do_lower_case=True))
    tokens = out.read_text(encoding="utf-8").split("\n")
    assert tokens[-1] == "" and "" not in tokens[:-1]  # one token per line, a final newline
    tokens = tokens[:-1]
    assert len(tokens) == len(set(tokens)) == result["vocab_size"] == 300
    vocab = load_vocab(out)
    assert list(vocab) == tokens and list(vocab.values()) == list(range(300))  # every id unique
    assert tokens[:104] == vocab_layout(99)
    pieces = tokens[104:]
    assert not [t for t in pieces if t.startswith("[")]
    # Single characters first, then their "##" forms for characters that can be inside a word, in code
    # point order; punctuation is split off by the basic tokenizer and gets no "##" piece.
    alphabet = [t for t in pieces if len(t) == 1]
    assert pieces[: len(alphabet)] == alphabet == sorted(alphabet)
    assert {".", ",", "!", "?"} <= set(alphabet) and "##." not in vocab and "##!" not in vocab
    continuing = ["##" + c for c in alphabet if can_continue(c)]
    assert pieces[len(alphabet) : len(alphabet) + len(continuing)] == continuing
    assert not [t for t in pieces if t != t.lower()]  # lower-cased
    assert "e" in vocab and "é" not in vocab and "ß" in vocab  # accents stripped; ß has no decomposition

    # The original's tokenizer (both paths) covers every word of the corpus with pieces, no [UNK], and
    # the pieces spell the word.
    text = corpus.read_text(encoding="utf-8")
    words = BasicTokenizer(do_lower_case=True).tokenize(text)
    for fast in (True, False):
        tokenizer = FullTokenizer(out, do_lower_case=True, fast=fast)
        for line in text.splitlines()[:50]:
            assert "[UNK]" not in tokenizer.tokenize(line)
    tokenizer = FullTokenizer(out, do_lower_case=True)
    for word in set(words):
        word_pieces = tokenizer.wordpiece_tokenizer.tokenize(word)
        assert "".join(p.removeprefix("##") for p in word_pieces) == word
        assert all(p.startswith("##") for p in word_pieces[1:]) and not word_pieces[0].startswith("##")
    # Learned pieces cut words into fewer pieces than characters.
    assert result["train"]["unk_rate"] == 0.0 and 1.0 < result["train"]["pieces_per_word"] < 2.0
    assert result["learned_pieces"] == 300 - 104 - result["alphabet_size"] - result["continuation_characters"] > 0

    stats = json.loads(stats_path(out).read_text())
    assert stats_path(out) == tmp_path / "out" / "vocab.stats.json"
    assert stats["words"] == len(words) and stats["distinct_words"] == len(set(words))
    assert stats["args"]["vocab_size"] == 300 and stats["command"] == "build-vocab"
    assert stats["train"] == result["train"]


def test_cased_vocab_keeps_capitals_and_accents(corpus, tmp_path):
    out = tmp_path / "vocab.txt"
    run_build_vocab(_args(corpus, out, do_lower_case=False))
    vocab = load_vocab(out)
    assert {"Z", "é", "ë"} <= set(vocab)
    tokenizer = FullTokenizer(out, do_lower_case=False)
    assert "[UNK]" not in tokenizer.tokenize("Zoë walked to the éclairs.")
    assert tokenizer.tokenize("Zoë")[0] != tokenizer.tokenize("zoë")[0]


def test_builds_are_reproducible(corpus, tmp_path):
    # The trainer numbers characters in hash order unless told otherwise; ties between merges follow ids.
    first, _ = build_vocab([str(corpus)], vocab_size=400, progress=False)
    for _ in range(2):
        again, _ = build_vocab([str(corpus)], vocab_size=400, progress=False)
        assert again == first


def test_limit_alphabet_and_long_words_are_unk(tmp_path):
    corpus = tmp_path / "c.txt"
    long_word = "ab" * 101  # 202 characters: the original's WordPiece gives [UNK] above 200
    corpus.write_text(f"aaa bbb ab ba abba qq\n{long_word}\n" * 20 + "x\n", encoding="utf-8")
    tokens, stats = build_vocab([str(corpus)], vocab_size=120, num_unused=0, limit_alphabet=3, progress=False)
    vocab = {t: i for i, t in enumerate(tokens)}
    assert [t for t in tokens if len(t) == 1] == ["a", "b", "q"]  # x is the rarest character
    assert stats["characters_left_out"] == 1
    tokenizer = FullTokenizer(vocab)
    assert tokenizer.tokenize("abba x xa " + long_word) == ["abba", "[UNK]", "[UNK]", "[UNK]"]
    # The long word was not trained on: "ab" * 101 would have given "##ab" and "abab".
    assert "abba" in vocab and "##ab" not in vocab and "abab" not in vocab
    assert stats["train"]["unk_rate"] == pytest.approx(21 / stats["words"])


def test_feed_spells_out_the_counts():
    counts = {"the": 100_000, "a": 3, "x" * 70_000: 2, "b": 1}
    fed = collections.Counter(w for chunk in _feed(counts) for w in chunk.split(" ") if w)
    assert fed == counts


def test_count_words_equals_the_tokenizer_line_by_line(tmp_path):
    lines = ["Héllo, WORLD!", "", "naïve\tcafé 中文字", "\u00adsoft\u200bhyphen end\r", "x" * 10]
    path = tmp_path / "t.txt.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8")))
    for lower in (True, False):
        expected = collections.Counter(w for line in lines for w in BasicTokenizer(do_lower_case=lower).tokenize(line))
        assert count_words([str(path)], lower, desc=None) == expected


def test_choose_alphabet_breaks_ties_by_code_point():
    alphabet, left_out = choose_alphabet({"ba": 2, "c": 2, "d": 1, "e": 1}, 4)
    assert alphabet == ["a", "b", "c", "d"] and left_out == 1


def test_coverage_counts_occurrences():
    vocab = {t: i for i, t in enumerate(["[UNK]", "un", "##want", "##ed", "want"])}
    stats = coverage(vocab, {"unwanted": 2, "want": 1, "zzz": 1})
    assert stats == {"words": 4, "distinct_words": 3, "unk_rate": 0.25, "pieces_per_word": (6 + 1 + 1) / 4}


def test_small_corpus_gives_a_smaller_vocab_and_says_so(tmp_path, caplog):
    corpus = tmp_path / "c.txt"
    corpus.write_text("low lower lowest\n", encoding="utf-8")
    tokens, stats = build_vocab([str(corpus)], vocab_size=1000, min_frequency=1, progress=False)
    assert len(tokens) == stats["vocab_size"] < 1000
    assert "lowest" in tokens and "not --vocab_size=1000" in caplog.text


def test_build_vocab_does_not_import_torch(corpus, tmp_path):
    code = (
        "import sys; from bert.cli import main; "
        f"assert main(['build-vocab', '--input_file={corpus}', '--output_file={tmp_path / 'v.txt'}', "
        "'--vocab_size=300']) == 0; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    assert len((tmp_path / "v.txt").read_text(encoding="utf-8").splitlines()) == 300


# --- bad input: one line, exit code 2, nothing written ---------------------------------------------------------


def _files(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


def test_bad_input(tmp_path, capsys, corpus):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "vocab.txt"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\n", encoding="utf-8")
    bad_utf8 = tmp_path / "bad.txt"
    bad_utf8.write_bytes(b"fine line\nbad \xff byte\n")
    cases = [
        ([f"--input_file={tmp_path}/nothing*.txt"], "nothing matches"),
        ([f"--input_file={empty}"], "no words in"),
        ([f"--input_file={corpus}", "--vocab_size=150"], "--vocab_size=150 is too small"),
        ([f"--input_file={corpus}", "--vocab_size=104"], "leaves no room"),
        ([f"--input_file={corpus}", "--num_unused=-1"], "--num_unused=-1"),
        ([f"--input_file={corpus}", "--limit_alphabet=0"], "--limit_alphabet=0"),
        ([f"--input_file={corpus}", f"--heldout_file={tmp_path}/none.txt"], "--heldout_file: nothing matches"),
        ([f"--input_file={bad_utf8}"], f"{bad_utf8}:2: bytes that are not valid UTF-8 at column"),
    ]
    for argv, fragment in cases:
        line = cli_error(capsys, "build-vocab", *argv, f"--output_file={out}")
        assert fragment in line, line
        assert _files(out_dir) == []
    line = cli_error(capsys, "build-vocab", f"--input_file={corpus}", f"--output_file={out_dir}")
    assert "is a directory" in line and _files(out_dir) == []
    # An existing vocab is kept whole when the new one cannot be built.
    out.write_text("old\n")
    cli_error(capsys, "build-vocab", f"--input_file={empty}", f"--output_file={out}")
    assert out.read_text() == "old\n" and _files(out_dir) == [out]
    # --decode_errors=ignore drops the bad byte, as the original did.
    argv = [f"--input_file={bad_utf8}", f"--output_file={out}", "--decode_errors=ignore", "--min_frequency=1"]
    assert cli_main(["build-vocab", *argv]) == 0
    assert {"bad", "byte"} <= set(load_vocab(out))


def test_library_errors_are_input_errors(tmp_path):
    empty = tmp_path / "e.txt"
    empty.write_text("")
    with pytest.raises(InputError, match="no words"):
        build_vocab([str(empty)], vocab_size=1000, progress=False)


# --- real text ---------------------------------------------------------------------------------------------------


def test_books_vocab_covers_a_held_out_book(tmp_path):
    """Trained on about 2.9 MB of novels (Austen, Carroll, Chesterton), tested on another book."""
    books = shared_path("data", "corpus", "nltk_gutenberg")
    train = [books / f"{name}.txt.gz" for name in ("austen-emma", "austen-pride", "austen-sense", "carroll-alice")]
    train.append(books / "chesterton-ball.txt.gz")
    heldout = books / "chesterton-brown.txt.gz"
    out = tmp_path / "vocab.txt"
    result = run_build_vocab(
        _args(",".join(map(str, train)), out, vocab_size=5000, heldout_file=str(heldout), do_lower_case=True)
    )
    assert result["vocab_size"] == 5000
    ours = result["heldout"]
    released = coverage({t: i for i, t in enumerate(_uncased_vocab())}, count_words([str(heldout)], True, desc=None))
    print(f"held-out book, ours (5000): {ours}; released uncased (30522): {released}")
    assert ours["words"] == released["words"] > 80_000
    assert ours["unk_rate"] < 0.01
    # A sixth of the entries costs some pieces per word, not many.
    assert released["pieces_per_word"] < ours["pieces_per_word"] < 1.25 * released["pieces_per_word"]
