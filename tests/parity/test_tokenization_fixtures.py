"""Our tokenizer against the original's recorded output, for the reference path and the fast path.

`tests/fixtures/tokenization/expected.jsonl.gz` holds, for 491 texts in 3 configurations, what the original
google-research/bert tokenizer produced (README there). Every line must match exactly: basic tokens,
word pieces and ids. The fast path is then held to the reference path on real data (when the shared data
folder is present) and on random strings built from the characters where the two could plausibly differ.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
import unicodedata
from pathlib import Path

import pytest

from bert.tokenization import FullTokenizer
from conftest import shared_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tokenization"

CONFIGS = {"uncased": True, "cased": False, "chinese": True}  # vocab -> do_lower_case


def _vocab_path(name: str, tmp_dir: Path) -> Path:
    path = tmp_dir / f"{name}.txt"
    if not path.exists():
        path.write_bytes(gzip.decompress((FIXTURES / f"vocab_{name}.txt.gz").read_bytes()))
    return path


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("vocab")
    return {name: _vocab_path(name, tmp) for name in CONFIGS}


@pytest.fixture(scope="module")
def expected() -> list[dict]:
    with gzip.open(FIXTURES / "expected.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_fixture_is_complete(expected):
    assert len(expected) == 1473
    assert {(r["vocab"], r["do_lower_case"]) for r in expected} == set(CONFIGS.items())
    # The fixture was recorded with Unicode 14.0; another version can legitimately change a few lines.
    if unicodedata.unidata_version != "14.0.0":
        pytest.skip(f"this Python has Unicode {unicodedata.unidata_version}; the fixture needs 14.0.0")


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])
@pytest.mark.parametrize("vocab", list(CONFIGS))
def test_every_fixture_line(expected, vocab_files, vocab, fast):
    if unicodedata.unidata_version != "14.0.0":
        pytest.skip(f"fixture recorded with Unicode 14.0.0, this Python has {unicodedata.unidata_version}")
    tok = FullTokenizer(vocab_files[vocab], do_lower_case=CONFIGS[vocab], fast=fast)
    rows = [r for r in expected if r["vocab"] == vocab]
    assert len(rows) == 491
    mismatches = []
    for r in rows:
        got = (
            tok.basic_tokenizer.tokenize(r["text"]),
            tok.tokenize(r["text"]),
            tok.convert_tokens_to_ids(tok.tokenize(r["text"])),
            tok.encode(r["text"]),
        )
        if got != (r["basic_tokens"], r["tokens"], r["ids"], r["ids"]):
            mismatches.append(r["id"])
    assert not mismatches, f"texts {mismatches[:10]} differ from the original ({len(mismatches)} in all)"
    texts = [r["text"] for r in rows]
    assert tok.tokenize_batch(texts) == [r["tokens"] for r in rows]
    assert tok.encode_batch(texts) == [r["ids"] for r in rows]
    # bytes input goes through convert_to_unicode (UTF-8), as in the original
    assert tok.tokenize_batch([t.encode("utf-8") for t in texts[:50]]) == [r["tokens"] for r in rows[:50]]


def test_fixture_edge_cases_present(expected):
    """The fixture covers the tokenizer's edge cases (empty text, special tokens in raw text, a word over
    200 characters); guard against a truncated copy."""
    texts = {r["text"] for r in expected}
    assert "" in texts
    assert "[CLS] [SEP] [MASK] [UNK] [PAD]" in texts
    assert any(len(t) > 300 and " " not in t for t in texts)  # the 340-char word


# ------------------------------------------------------------------------------------------------------
# fast path == reference path beyond the fixture
# ------------------------------------------------------------------------------------------------------

# Characters where a whole-text or table-driven pipeline could drift from the per-character original.
_TRICKY = (
    "aAzZ09 ,.!?-'$`^|~+<=>\"#%&*()[]{}\\/_@;:"
    "\t\n\r\x0b\x0c\x1c\x1f\x00\x7f\x85\xa0\xad"  # controls, NEL, NBSP, soft hyphen
    "\u2028\u2029\u3000\u2000\u2001\u200b\u200d\u2060\ufeff\ufffd\u180e"  # separators, zero-width, BOM
    "ΣσςΑΒΓ ΌΆ"  # Greek sigma: lower-casing looks at context
    "İIıi\u0307ẞß\u1e9e"  # Turkish dotted/dotless I, capital sharp s
    "e\u0301\u0300\u0323\u0345\u05b0\u0e31\u093f\u094d"  # combining marks (Mn and non-Mn)
    "éÉñÑåÅ\u00c5\u212b\u1e09\u01c4\u01c5\u01c6\ufb01"  # precomposed, compatibility, ligature
    "한국어\u1100\u1161\u11a8日本語にほんゴ\u309a中文字\uf900\uf9ff\u2f00"  # Hangul, kana, CJK, compat
    "\U00020000\U0002a6d6\U0002f800\U0001d400\U0001f600\U0001f3fb\U0001f1fa\U000e0001\U000e0067"
    "\ue000\U000f0000\u0378\U0001d173\U00010000\ud800"  # private use, unassigned, astral Cf, surrogate
    "\u0600\u061c\u200e\u202e"  # Arabic number sign (Cf), bidi marks
    "\u00bf\u00a1\u2018\u2019\u201c\u201d\u2026\u3001\u3002\uff01\uff0c\u058a\u05be"  # Unicode punctuation
)


def _random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    chars = list(_TRICKY)
    words = ["unaffable", "running", "[MASK]", "[SEP]", "straße", "ΟΔΥΣΣΕΥΣ", "naïve", "x" * 205]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 12)):
            if rng.random() < 0.3:
                parts.append(rng.choice(words))
            else:
                parts.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 6))))
        out.append(rng.choice(["", " ", "\u2028", "\t"]).join(parts))
    return out


RANDOM_CASES = [
    ("uncased", {}),
    ("cased", {}),
    ("chinese", {}),
    ("uncased", {"legacy_control_chars": True}),
    ("cased", {"legacy_control_chars": True, "tokenize_chinese_chars": False}),
    ("uncased", {"never_split": ["[MASK]", "[SEP]"]}),
    ("cased", {"strip_accents": True}),
    ("uncased", {"strip_accents": False}),
]


@pytest.mark.parametrize("case", range(len(RANDOM_CASES)))
def test_fast_matches_reference_on_random_text(vocab_files, case):
    vocab, kwargs = RANDOM_CASES[case]
    texts = _random_texts(400, seed=case)
    lower = CONFIGS[vocab]
    ref = FullTokenizer(vocab_files[vocab], do_lower_case=lower, fast=False, **kwargs)
    fast = FullTokenizer(vocab_files[vocab], do_lower_case=lower, fast=True, **kwargs)
    for text in texts:
        assert fast.basic_tokenizer.tokenize(text) == ref.basic_tokenizer.tokenize(text), ascii(text)
        assert fast.tokenize(text) == ref.tokenize(text), ascii(text)
    assert fast.encode_batch(texts) == [ref.convert_tokens_to_ids(ref.tokenize(t)) for t in texts]


def _shared_lines(every: int) -> list[str]:
    ml = shared_path("data", "multilingual_sentences")
    docs = shared_path("data", "bert_docs")
    lines: list[str] = []
    for path in sorted(ml.glob("*.txt")):
        lines += path.read_text(encoding="utf-8").split("\n")[::every]
    for path in sorted(docs.glob("*.md")):
        lines += path.read_text(encoding="utf-8").split("\n")
    return lines


@pytest.mark.parametrize("vocab,kwargs", [("uncased", {}), ("cased", {}), ("uncased", {"legacy_control_chars": True})])
def test_fast_matches_reference_on_shared_data(vocab_files, vocab, kwargs):
    """75 languages of real sentences plus the BERT docs: fast and reference agree line by line."""
    lines = _shared_lines(every=120 if vocab != "uncased" or kwargs else 60)
    ref = FullTokenizer(vocab_files[vocab], do_lower_case=CONFIGS[vocab], fast=False, **kwargs)
    fast = FullTokenizer(vocab_files[vocab], do_lower_case=CONFIGS[vocab], fast=True, **kwargs)
    expected = [ref.convert_tokens_to_ids(ref.tokenize(t)) for t in lines]
    assert fast.encode_batch(lines) == expected
    assert [fast.encode(t) for t in lines] == expected


def test_fast_path_small_memo_is_still_exact(vocab_files):
    """A memo that keeps emptying itself changes speed, never output."""
    texts = _random_texts(200, seed=7)
    ref = FullTokenizer(vocab_files["uncased"], fast=False)
    fast = FullTokenizer(vocab_files["uncased"], fast=True, cache_size=5)
    assert fast.tokenize_batch(texts) == [ref.tokenize(t) for t in texts]
    assert fast.encode_batch(texts) == [ref.convert_tokens_to_ids(ref.tokenize(t)) for t in texts]
    assert len(fast._word_ids_memo) <= 5
    assert len(fast.wordpiece_tokenizer._word_memo) <= 5


@pytest.mark.skipif(sys.platform == "win32", reason="process pool start-up is slow on Windows")
def test_encode_batch_in_processes(vocab_files):
    texts = _random_texts(8000, seed=3)
    tok = FullTokenizer(vocab_files["uncased"])
    single = tok.encode_batch(texts)
    assert tok.encode_batch(texts, num_workers=2) == single
    assert FullTokenizer(vocab_files["uncased"]).encode_batch(texts, num_workers=2) == single


def test_encode_batch_in_spawned_processes(vocab_files, monkeypatch):
    """The start method used where fork is unavailable (macOS default, Windows)."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    texts = _random_texts(8000, seed=4)
    tok = FullTokenizer(vocab_files["cased"], do_lower_case=False, never_split=["[MASK]"])
    assert tok.encode_batch(texts, num_workers=2) == tok.encode_batch(texts)
