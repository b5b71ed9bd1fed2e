"""bert.tokenization: the original tokenization_test.py cases, the opt-in options, the character tables of
the fast path checked against the reference predicates for every code point, and `bert tokenize`."""

from __future__ import annotations

import gzip
import json
import random
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from bert import cli
from bert.errors import InputError
from bert.tokenization import (
    BasicTokenizer,
    CaseMismatchError,
    FullTokenizer,
    WordpieceTokenizer,
    _char_tables,
    _is_control,
    _is_punctuation,
    _is_whitespace,
    convert_ids_to_tokens,
    convert_to_unicode,
    convert_tokens_to_ids,
    load_vocab,
    printable_text,
    validate_case_matches_checkpoint,
    whitespace_tokenize,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tokenization"
BOTH = pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast"])

# The vocabulary of the original tokenization_test.py.
TEST_VOCAB = ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ","]


def write_vocab(path: Path, tokens: list[str]) -> Path:
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return path


@pytest.fixture
def test_vocab_file(tmp_path) -> Path:
    return write_vocab(tmp_path / "vocab.txt", TEST_VOCAB)


@pytest.fixture(scope="module")
def uncased_vocab_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_bytes(gzip.decompress((FIXTURES / "vocab_uncased.txt.gz").read_bytes()))
    return path


# ------------------------------------------------------------------------------------------------------
# the original tokenization_test.py
# ------------------------------------------------------------------------------------------------------


@BOTH
def test_full_tokenizer(test_vocab_file, fast):
    tokenizer = FullTokenizer(test_vocab_file, fast=fast)
    tokens = tokenizer.tokenize("UNwant\u00e9d,running")
    assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert tokenizer.convert_tokens_to_ids(tokens) == [7, 4, 5, 10, 8, 9]
    assert tokenizer.encode("UNwant\u00e9d,running") == [7, 4, 5, 10, 8, 9]
    assert tokenizer.convert_ids_to_tokens([7, 4, 5, 10, 8, 9]) == tokens


@BOTH
def test_chinese(fast):
    assert BasicTokenizer(fast=fast).tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]


@BOTH
def test_basic_tokenizer_lower(fast):
    tokenizer = BasicTokenizer(do_lower_case=True, fast=fast)
    assert tokenizer.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are", "you", "?"]
    assert tokenizer.tokenize("H\u00e9llo") == ["hello"]


@BOTH
def test_basic_tokenizer_no_lower(fast):
    tokenizer = BasicTokenizer(do_lower_case=False, fast=fast)
    assert tokenizer.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["HeLLo", "!", "how", "Are", "yoU", "?"]


@BOTH
def test_wordpiece_tokenizer(fast):
    vocab = {token: i for i, token in enumerate(TEST_VOCAB[:-1])}
    tokenizer = WordpieceTokenizer(vocab=vocab, fast=fast)
    assert tokenizer.tokenize("") == []
    assert tokenizer.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert tokenizer.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]


def test_convert_tokens_to_ids():
    vocab = {token: i for i, token in enumerate(TEST_VOCAB[:-1])}
    assert convert_tokens_to_ids(vocab, ["un", "##want", "##ed", "runn", "##ing"]) == [7, 4, 5, 8, 9]


def test_is_whitespace():
    for c in (" ", "\t", "\r", "\n", "\u00a0"):
        assert _is_whitespace(c)
    for c in ("A", "-"):
        assert not _is_whitespace(c)


def test_is_control():
    assert _is_control("\u0005")
    for c in ("A", " ", "\t", "\r", "\U0001f4a9"):
        assert not _is_control(c)


def test_is_punctuation():
    for c in ("-", "$", "`", "."):
        assert _is_punctuation(c)
    for c in ("A", " "):
        assert not _is_punctuation(c)


# ------------------------------------------------------------------------------------------------------
# text helpers and vocabulary
# ------------------------------------------------------------------------------------------------------


def test_convert_to_unicode_drops_invalid_utf8():
    assert convert_to_unicode(b"caf\xc3\xa9\xff!") == "café!"
    assert convert_to_unicode("x") == "x"
    assert printable_text(b"\xc3\xa9") == "é"
    with pytest.raises(ValueError, match="Unsupported string type"):
        convert_to_unicode(5)


def test_whitespace_tokenize_uses_str_split():
    assert whitespace_tokenize("") == []
    assert whitespace_tokenize("  \t ") == []
    # U+2028 is not `_is_whitespace`, but str.split() separates on it, as in the original
    assert whitespace_tokenize(" a\u2028b  c ") == ["a", "b", "c"]


def test_load_vocab_strips_and_later_duplicates_win(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("a\r\n b \n\nb\né\n".encode())
    vocab = load_vocab(path)
    assert list(vocab.items()) == [("a", 0), ("b", 3), ("", 2), ("é", 4)]
    tokenizer = FullTokenizer(path)
    assert tokenizer.inv_vocab == {0: "a", 3: "b", 2: "", 4: "é"}
    with pytest.raises(KeyError):
        tokenizer.convert_ids_to_tokens([1])  # the overwritten id is gone


def test_load_vocab_without_final_newline(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"x\ny")
    assert dict(load_vocab(path)) == {"x": 0, "y": 1}
    path.write_bytes(b"")
    assert dict(load_vocab(path)) == {}


def test_load_vocab_errors_name_the_file(tmp_path):
    with pytest.raises(InputError, match=r"vocab file '.*missing\.txt' not found"):
        load_vocab(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nfine\n\xff\xfe\n")
    with pytest.raises(InputError, match=r"bad\.txt' line 3: not valid UTF-8"):
        load_vocab(bad)


@BOTH
def test_unknown_tokens_and_ids_raise_key_error(test_vocab_file, fast):
    tokenizer = FullTokenizer(test_vocab_file, fast=fast)
    with pytest.raises(KeyError):
        tokenizer.convert_tokens_to_ids(["un", "nope"])
    with pytest.raises(KeyError):
        tokenizer.convert_ids_to_tokens([0, 999])
    with pytest.raises(KeyError):
        convert_ids_to_tokens(tokenizer.inv_vocab, [-1])


@BOTH
def test_missing_unk_is_an_input_error_on_ids_only(tmp_path, fast):
    """Without [UNK] in the vocab, tokenize still emits it; converting it to an id is what fails, with one
    line naming the vocabulary and the fix."""
    tokenizer = FullTokenizer(write_vocab(tmp_path / "v.txt", ["un", "##want"]), fast=fast)
    assert tokenizer.tokenize("unwant zzz") == ["un", "##want", "[UNK]"]
    assert tokenizer.encode("unwant") == [0, 1]
    with pytest.raises(InputError, match=r"v\.txt has no \[UNK\] token.*add a line \[UNK\]"):
        tokenizer.encode("unwant zzz")
    with pytest.raises(InputError, match=r"has no \[UNK\] token"):
        tokenizer.encode_batch(["zzz"])


def test_vocab_mapping_accepted():
    tokenizer = FullTokenizer({t: i for i, t in enumerate(TEST_VOCAB)})
    assert tokenizer.encode("unwanted") == [7, 4, 5]


# ------------------------------------------------------------------------------------------------------
# WordPiece details
# ------------------------------------------------------------------------------------------------------


@BOTH
def test_words_longer_than_200_chars_are_unknown(fast):
    tokenizer = WordpieceTokenizer({"[UNK]": 0, "a": 1, "##a": 2}, fast=fast)
    assert tokenizer.tokenize("a" * 200) == ["a"] + ["##a"] * 199
    assert tokenizer.tokenize("a" * 201) == ["[UNK]"]
    assert tokenizer.tokenize("a" * 201 + " a") == ["[UNK]", "a"]
    short = WordpieceTokenizer({"[UNK]": 0, "a": 1, "##a": 2}, max_input_chars_per_word=5, fast=fast)
    assert short.tokenize("aaaaa aaaaaa") == ["a", "##a", "##a", "##a", "##a", "[UNK]"]


@BOTH
def test_limit_counts_code_points_after_basic_tokenization(uncased_vocab_file, fast):
    tokenizer = FullTokenizer(uncased_vocab_file, fast=fast)
    # 200 letters then punctuation: the punctuation is split off first, so the word has exactly 200
    assert tokenizer.tokenize("a" * 200 + "!")[-1] == "!"
    assert "[UNK]" not in tokenizer.tokenize("a" * 200 + "!")
    assert tokenizer.tokenize("é" * 201) == ["[UNK]"]  # accents stripped, still 201 characters


@BOTH
def test_wordpiece_greedy_longest_match_without_backtracking(fast):
    vocab = {"[UNK]": 0, "ab": 1, "a": 2, "##bc": 3, "##c": 4, "##b": 5, "##ing": 6}
    tokenizer = WordpieceTokenizer(vocab, fast=fast)
    # "abc": longest first piece "ab", then "##c"
    assert tokenizer.tokenize("abc") == ["ab", "##c"]
    # "abd": "ab" then nothing matches "d" -> the whole word is [UNK] (no retry with "a" + "##bd")
    assert tokenizer.tokenize("abd") == ["[UNK]"]
    # a word that itself starts with "##" is looked up as is for its first piece
    assert tokenizer.tokenize("##ing") == ["##ing"]


# ------------------------------------------------------------------------------------------------------
# options: legacy control characters, never_split, strip_accents, tokenize_chinese_chars
# ------------------------------------------------------------------------------------------------------


def test_is_control_legacy_rule():
    for c in ("\ue000", "\U000f0000", "\u0378", "\ud800"):  # private use, unassigned, surrogate
        assert not _is_control(c)
        assert _is_control(c, legacy=True)
    for c in ("\u200b", "\x7f", "\ufeff"):  # Cf and Cc: control under both rules
        assert _is_control(c) and _is_control(c, legacy=True)
    for c in ("\t", "\n", "\r", "\U0001f4a9"):
        assert not _is_control(c) and not _is_control(c, legacy=True)


@BOTH
def test_private_use_char_removed_only_in_legacy_mode(fast):
    head = BasicTokenizer(fast=fast)
    legacy = BasicTokenizer(legacy_control_chars=True, fast=fast)
    text = "a\ue000b c\u0378 \U0001f4a9"
    assert head.tokenize(text) == ["a\ue000b", "c\u0378", "\U0001f4a9"]
    assert legacy.tokenize(text) == ["ab", "c", "\U0001f4a9"]
    assert head.tokenize("x\u200by") == legacy.tokenize("x\u200by") == ["xy"]  # zero-width space: Cf


@BOTH
def test_never_split(test_vocab_file, tmp_path, fast):
    default = BasicTokenizer(fast=fast)
    assert default.tokenize("want [MASK] now") == ["want", "[", "mask", "]", "now"]  # the original
    protected = BasicTokenizer(never_split=["[MASK]"], fast=fast)
    assert protected.tokenize("Want [MASK] now") == ["want", "[MASK]", "now"]
    assert protected.tokenize("x[MASK]") == ["x", "[", "mask", "]"]  # only whole whitespace chunks
    vocab = write_vocab(tmp_path / "v.txt", TEST_VOCAB + ["[MASK]"])
    full = FullTokenizer(vocab, never_split=["[MASK]"], fast=fast)
    assert full.tokenize("UNwanted [MASK]") == ["un", "##want", "##ed", "[MASK]"]
    assert full.encode("UNwanted [MASK]") == [7, 4, 5, 11]


@BOTH
def test_strip_accents_and_chinese_options(fast):
    assert BasicTokenizer(do_lower_case=False, strip_accents=True, fast=fast).tokenize("Héllo") == ["Hello"]
    assert BasicTokenizer(do_lower_case=True, strip_accents=False, fast=fast).tokenize("Héllo") == ["héllo"]
    assert BasicTokenizer(tokenize_chinese_chars=False, fast=fast).tokenize("ah\u535a\u63a8zz") == ["ah\u535a\u63a8zz"]


@BOTH
def test_uncased_quirks(fast):
    tokenizer = BasicTokenizer(fast=fast)
    # NFD without recomposition: Hangul syllables become conjoining jamo, kana lose their voicing marks
    assert tokenizer.tokenize("한") == ["\u1112\u1161\u11ab"]
    assert tokenizer.tokenize("ガ") == ["カ"]
    # str.lower() picks final sigma from context within the whitespace chunk, before punctuation is split
    # off: "." is case-ignorable, so in "ΟΔΟΣ.ΣΑ" the Σ is followed by a letter and is not final
    assert tokenizer.tokenize("ΟΔΟΣ ΣΑ") == ["οδος", "σα"]
    assert tokenizer.tokenize("ΟΔΟΣ.ΣΑ") == ["οδοσ", ".", "σα"]


def test_tokenizer_config(test_vocab_file):
    tokenizer = FullTokenizer(test_vocab_file, do_lower_case=False, never_split=["[SEP]"])
    assert tokenizer.tokenizer_config() == {
        "do_lower_case": False,
        "tokenize_chinese_chars": True,
        "strip_accents": False,
        "legacy_control_chars": False,
        "never_split": ["[SEP]"],
    }


# ------------------------------------------------------------------------------------------------------
# fast-path character tables == reference predicates, for every code point
# ------------------------------------------------------------------------------------------------------

ALL_CHARS = "".join(map(chr, range(sys.maxunicode + 1)))
BMP_CHARS = ALL_CHARS[:0x10000]
CATEGORIES = list(map(unicodedata.category, ALL_CHARS))


@pytest.mark.parametrize("legacy", [False, True])
def test_removal_tables_match_reference(legacy):
    tables = _char_tables(legacy)
    kept = "".join(c for c in ALL_CHARS if not (c in "\x00\ufffd" or _is_control(c, legacy)))
    assert tables.remove_any.sub("", ALL_CHARS) == kept
    assert tables.remove_bmp.sub("", BMP_CHARS) == kept[: kept.index("\U00010000")]


def test_mark_and_cjk_tables_match_reference():
    tables = _char_tables(False)
    no_marks = "".join(c for c, cat in zip(ALL_CHARS, CATEGORIES) if cat != "Mn")
    assert tables.mark_any.sub("", ALL_CHARS) == no_marks
    assert tables.mark_bmp.sub("", BMP_CHARS) == no_marks[: no_marks.index("\U00010000")]
    is_cjk = BasicTokenizer(fast=False)._is_chinese_char
    assert not any(is_cjk(cp) for cp in (0x30000, 0x3134A, 0xE0001, 0x10FFFF))
    assert tables.cjk.findall(ALL_CHARS) == [c for c in ALL_CHARS[:0x30000] if is_cjk(ord(c))]


def test_split_tables_match_reference():
    tables = _char_tables(False)
    text = "".join(c for c in ALL_CHARS if not c.isspace())
    reference = BasicTokenizer(fast=False)._run_split_on_punc(text)
    assert tables.split_any.findall(text) == reference
    bmp = text[: text.index("\U00010000")]
    assert tables.split_bmp.findall(bmp) == BasicTokenizer(fast=False)._run_split_on_punc(bmp)
    ascii_text = "".join(chr(i) for i in range(128) if not chr(i).isspace())
    from bert.tokenization import _ASCII_SPLIT

    assert _ASCII_SPLIT.findall(ascii_text) == BasicTokenizer(fast=False)._run_split_on_punc(ascii_text)


def test_whole_text_pipeline_assumptions():
    """The facts that let the fast path lower-case, normalise and split the whole text at once."""
    spaces = [c for c in ALL_CHARS if c.isspace()]
    assert re.findall(r"\s", ALL_CHARS) == spaces  # `\s` is str.split()'s whitespace
    assert all(c.isspace() for c in ALL_CHARS if _is_whitespace(c))
    for c in spaces:
        assert c.lower() == c and unicodedata.combining(c) == 0  # untouched, and an NFD starter
        assert unicodedata.normalize("NFD", c).isspace()
    astral = re.compile("[\U00010000-\U0010ffff]")
    # unassigned, private use, surrogates: no case mapping or decomposition (checked in bulk)
    inert = "".join(c for c, cat in zip(ALL_CHARS, CATEGORIES) if cat in ("Cn", "Co", "Cs"))
    assert inert.lower() == inert == unicodedata.normalize("NFD", inert)
    for c, cat in zip(ALL_CHARS, CATEGORIES):
        if cat in ("Cn", "Co", "Cs"):
            continue
        low, nfd = c.lower(), unicodedata.normalize("NFD", c)
        if not c.isspace():
            assert not any(x.isspace() for x in low + nfd), ascii(c)
        if c <= "\uffff":
            # BMP text keeps the BMP-only mark and punctuation patterns after lower() and NFD: any
            # character above U+FFFF those can produce (U+FA6C -> U+242EE) is neither a mark nor punctuation
            for x in astral.findall(low + unicodedata.normalize("NFD", low)):
                assert unicodedata.category(x) != "Mn" and not _is_punctuation(x), ascii(c)
        if _is_chinese_char(ord(c)) or any(_is_chinese_char(ord(x)) for x in nfd):
            assert all(_is_chinese_char(ord(x)) for x in nfd), ascii(c)


def _is_chinese_char(cp: int) -> bool:
    return BasicTokenizer(fast=False)._is_chinese_char(cp)


# ------------------------------------------------------------------------------------------------------
# validate_case_matches_checkpoint
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "do_lower_case,checkpoint",
    [
        (True, ""),
        (False, None),
        (True, "/models/uncased_L-12_H-768_A-12/bert_model.ckpt"),
        (False, "/models/cased_L-12_H-768_A-12/bert_model.ckpt"),
        (True, "/models/chinese_L-12_H-768_A-12/bert_model.ckpt"),
        (False, "/models/wwm_uncased_L-24_H-1024_A-16/bert_model.ckpt"),  # not listed: never checked
        (True, "/models/my_model/bert_model.ckpt"),
        (False, "/models/uncased_L-12_H-768_A-12/model.ckpt-1000"),  # not bert_model.ckpt: not checked
    ],
)
def test_validate_case_accepts(do_lower_case, checkpoint):
    validate_case_matches_checkpoint(do_lower_case, checkpoint)


@pytest.mark.parametrize(
    "do_lower_case,checkpoint,wanted",
    [
        (False, "/m/uncased_L-12_H-768_A-12/bert_model.ckpt", True),
        (False, "gs://b/multilingual_L-12_H-768_A-12/bert_model.ckpt", True),
        (True, "/m/cased_L-24_H-1024_A-16/bert_model.ckpt", False),
        (True, "/m/multi_cased_L-12_H-768_A-12/bert_model.ckpt-1000", False),
    ],
)
def test_validate_case_rejects(do_lower_case, checkpoint, wanted):
    with pytest.raises(CaseMismatchError) as info:
        validate_case_matches_checkpoint(do_lower_case, checkpoint)
    assert isinstance(info.value, InputError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert f"pass --do_lower_case={wanted}" in message and checkpoint in message and "\n" not in message


# ------------------------------------------------------------------------------------------------------
# import hygiene and the CLI
# ------------------------------------------------------------------------------------------------------


def test_import_does_not_need_torch():
    code = "import sys, bert.tokenization; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_tokenize_files(test_vocab_file, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(
        "UNwant\u00e9d,running\n".encode() + b'{"text": "want runn", "id": 3}\n\n{"no_text": 1}\nwa\xff\r\n'
    )
    out = tmp_path / "out.jsonl"
    argv = ["tokenize", f"--vocab_file={test_vocab_file}", "--input_file", str(src), f"--output_file={out}"]
    assert cli.main(argv) == 2 and not out.exists()  # undecodable bytes are an error by default
    assert cli.main([*argv, "--decode_errors=ignore"]) == 0  # and dropped on request, as the original did
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows == [
        {
            "text": "UNwant\u00e9d,running",
            "tokens": ["un", "##want", "##ed", ",", "runn", "##ing"],
            "ids": [7, 4, 5, 10, 8, 9],
        },
        {"text": "want runn", "tokens": ["want", "runn"], "ids": [3, 8]},
        {"text": "", "tokens": [], "ids": []},
        {"text": '{"no_text": 1}', "tokens": ["[UNK]"] * 9, "ids": [0] * 9},  # no "text": a plain line
        {"text": "wa", "tokens": ["wa"], "ids": [6]},  # invalid UTF-8 byte dropped, CRLF removed
    ]


def test_cli_do_lower_case_false(test_vocab_file, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("UNwanted running\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert (
        cli.main(
            [
                "tokenize",
                f"--vocab_file={test_vocab_file}",
                "--do_lower_case=false",
                f"--input_file={src}",
                f"--output_file={out}",
            ]
        )
        == 0
    )
    assert json.loads(out.read_text(encoding="utf-8"))["tokens"] == ["[UNK]", "runn", "##ing"]


def test_cli_stdin_to_stdout(test_vocab_file):
    proc = subprocess.run(
        [sys.executable, "-m", "bert", "tokenize", "--vocab_file", str(test_vocab_file)],
        input=b"unwanted\nrunning,\n",
        capture_output=True,
        check=True,
    )
    lines = proc.stdout.decode("utf-8").splitlines()
    assert [json.loads(x)["ids"] for x in lines] == [[7, 4, 5], [8, 9, 10]]


@pytest.mark.parametrize("missing", ["vocab_file", "input_file"])
def test_cli_missing_file_is_a_one_line_error(test_vocab_file, tmp_path, capsys, missing):
    paths = {"vocab_file": str(test_vocab_file), "input_file": str(test_vocab_file)}
    paths[missing] = str(tmp_path / "nope.txt")
    out = tmp_path / "out.jsonl"
    rc = cli.main(["tokenize", *(f"--{k}={v}" for k, v in paths.items()), f"--output_file={out}"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--{missing}=" in err and "nope.txt" in err and "not found" in err
    assert not out.exists()


def test_cli_bad_json_text_names_the_line(test_vocab_file, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "ok"}\n{"text": 5}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc = cli.main(["tokenize", f"--vocab_file={test_vocab_file}", f"--input_file={src}", f"--output_file={out}"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "in.jsonl line 2" in err and '"text"' in err and "\n" not in err
    assert not out.exists()  # nothing half-written


# ------------------------------------------------------------------------------------------------------
# Basic tokens with their character spans (used to map NER entities back to the raw text)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_tokenize_with_offsets_spans_the_raw_characters(do_lower_case):
    text = "  Héllo,\tWORLD!! na\u0308ive 北京x\x00y  (U.S.)\u00a0end"
    bt = BasicTokenizer(do_lower_case=do_lower_case)
    got = bt.tokenize_with_offsets(text)
    assert [t for t, _, _ in got] == bt.tokenize(text)
    spans = [text[s:e] for _, s, e in got]
    # The NUL inside "x\x00y" is dropped without splitting; the combining diaeresis stays with its word.
    assert spans == [
        *("Héllo", ",", "WORLD", "!", "!", "na\u0308ive", "北", "京", "x\x00y", "(", "U", ".", "S", ".", ")", "end")
    ]
    for token, s, e in got:
        assert bt.tokenize(text[s:e]) == [token]


@pytest.mark.parametrize("do_lower_case", [True, False])
@pytest.mark.parametrize("legacy_control_chars", [False, True])
def test_tokenize_with_offsets_runs_equal_the_character_by_character_spans(do_lower_case, legacy_control_chars):
    """Printable-ASCII runs between " \t\n\r" take a regular expression, the rest goes character by
    character: the same tokens and spans as the character-by-character walk over the whole text, on random
    mixes of ASCII, whitespace of every kind, control characters, accents, CJK, ligatures and astral
    characters (the all-ASCII text's one-pass path included)."""
    bt = BasicTokenizer(do_lower_case=do_lower_case, legacy_control_chars=legacy_control_chars)
    pool = [*"abcXYZ09", *"!.,-()'", *" \t\n\r", "\x0b", "\x0c", "\x1c", "\x00", "\x01", "\x7f", "\ufffd"]
    pool += ["\u00a0", "\u2028", "\u3000", "é", "e\u0301", "\u0301", "北", "“", "’", "—", "Σ", "ﬁ", "😀", "ا"]
    rng = random.Random(0)
    for n in range(600):
        ascii_only = n % 3 == 0
        chars = [c for c in pool if c.isascii()] if ascii_only else pool
        text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 40)))
        got = bt.tokenize_with_offsets(text)
        tokens = bt.tokenize(text)
        assert got == [(t, a, b) for t, (a, b) in zip(tokens, bt._spans_by_character(text), strict=True)], repr(text)


def test_tokenize_with_offsets_walks_only_the_runs_that_are_not_printable_ascii(monkeypatch):
    bt = BasicTokenizer()
    walked: list[str] = []
    by_character = bt._spans_by_character
    monkeypatch.setattr(bt, "_spans_by_character", lambda text: walked.append(text) or by_character(text))
    assert [t for t, _, _ in bt.tokenize_with_offsets("Plain ASCII, text.\n")] == ["plain", "ascii", ",", "text", "."]
    assert not walked
    got = bt.tokenize_with_offsets("a naïve “quick” fox")
    assert walked == ["naïve", "“quick”"]
    assert got == [("a", 0, 1), ("naive", 2, 7), ("“", 8, 9), ("quick", 9, 14), ("”", 14, 15), ("fox", 16, 19)]


@pytest.mark.parametrize("vocab", ["test_vocab_file", "uncased_vocab_file"])
def test_full_tokenizer_offsets_equal_the_reference_tokenizers(vocab, request):
    """The fast tokenizer's pieces (memoised) and spans equal the reference port's, [UNK] words included."""
    path = request.getfixturevalue(vocab)
    fast = FullTokenizer(path, do_lower_case=True)
    reference = FullTokenizer(path, do_lower_case=True, fast=False)
    texts = ("The unaffable runner's “quick” fox, na\u0308ive 北京 ﬁne!", "unwanted running, plain ascii text.")
    for text in texts:
        got = fast.tokenize_with_offsets(text)
        assert got == reference.tokenize_with_offsets(text)
        assert [i for _, i, _, _ in got] == fast.encode(text)


def test_tokenize_with_offsets_on_75_languages():
    from conftest import shared_path

    files = sorted(shared_path("data", "multilingual_sentences").glob("*.txt"))
    for do_lower_case in (True, False):
        bt = BasicTokenizer(do_lower_case=do_lower_case)
        for path in files:
            for line in path.read_text(encoding="utf-8").splitlines()[:20]:
                got = bt.tokenize_with_offsets(line)
                assert [t for t, _, _ in got] == bt.tokenize(line)
                ends = [0] + [e for _, _, e in got]
                for (token, s, e), prev_end in zip(got, ends):
                    assert prev_end <= s < e, (path.name, line)
                    # Re-tokenized alone a span gives its token; a word-final sigma alone lower-cases to σ.
                    assert bt.tokenize(line[s:e]) in ([token], [token.replace("ς", "σ")]), (path.name, line)
