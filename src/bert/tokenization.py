"""WordPiece tokenization with the behaviour of google-research/bert's `tokenization.py` at its last commit.

Reference: google-research/bert `tokenization.py` @ eedf571 (2020-03-11). The public names are the
original's, so `from bert import tokenization; tokenization.FullTokenizer(vocab_file, do_lower_case)` ports
unchanged. This module does not import torch.

Two implementations with identical output live side by side:

- the *reference path* (`fast=False`): a plain, readable port of the original algorithm, character by
  character. It is the oracle the tests hold the fast path to.
- the *fast path* (`fast=True`, the default): the same pipeline, reorganised so that nearly all the work
  is done in C. The basic tokenizer runs each step on the whole text in one call (regular expressions
  whose character classes are built from `unicodedata` for every code point, `str.lower`,
  `unicodedata.normalize`), which `BasicTokenizer._tokenize_fast` shows is exact. Each basic token is then
  looked up in a memo (word -> pieces, word -> ids); only words never seen before run WordPiece, searching
  forwards through prefix tables of the vocab. `FullTokenizer.encode_batch` is the bulk entry point.

The pipeline (`BasicTokenizer` then `WordpieceTokenizer`):

1. drop NUL, U+FFFD and control characters (`_is_control`); map whitespace to spaces;
2. put spaces around CJK ideographs;
3. split on whitespace; per chunk: lower-case, then NFD and drop non-spacing marks (uncased only);
   split every punctuation character off as its own token;
4. WordPiece: greedy longest match first against the vocab; `##` marks a word-internal piece; a word with a
   piece that matches nothing, or longer than 200 characters, becomes one `[UNK]`.

Opt-in departures from the original (all off by default): `legacy_control_chars` (the pre-2019-03 rule that
removed every Unicode category starting with "C"), `never_split` (chunks passed through whole),
`tokenize_chinese_chars=False` and `strip_accents` (decoupled from `do_lower_case`, as in HF).
"""

from __future__ import annotations

import collections
import functools
import gc
import itertools
import json
import multiprocessing
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bert.errors import InputError
from bert.utils import decode_line

__all__ = [
    "BasicTokenizer",
    "CaseMismatchError",
    "FullTokenizer",
    "SPECIAL_TOKENS",
    "WordpieceTokenizer",
    "convert_by_vocab",
    "convert_ids_to_tokens",
    "convert_to_unicode",
    "convert_tokens_to_ids",
    "load_vocab",
    "printable_text",
    "read_texts",
    "validate_case_matches_checkpoint",
    "whitespace_tokenize",
]

# Model directory names of the released checkpoints, by casing (original `validate_case_matches_checkpoint`).
# Whole-word-masking and the small models are not listed there, so they are never checked.
_LOWER_CASED_MODELS = frozenset(
    {
        "uncased_L-24_H-1024_A-16",
        "uncased_L-12_H-768_A-12",
        "multilingual_L-12_H-768_A-12",
        "chinese_L-12_H-768_A-12",
    }
)
_CASED_MODELS = frozenset({"cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16", "multi_cased_L-12_H-768_A-12"})

# The CJK Unified Ideographs blocks the original treats as "Chinese characters" (inclusive code-point
# ranges). Hangul, Hiragana and Katakana are deliberately absent: they go through whitespace + WordPiece.
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)

# Memo size per cache before it is emptied and refilled; bounds memory on endless streams of new words.
_DEFAULT_CACHE_SIZE = 1 << 19
# The vocabulary entries every BERT vocab.txt reserves (the original's create_pretraining_data.py and
# run_classifier.py write them); `FullTokenizer.decode` can leave them out.
SPECIAL_TOKENS = frozenset({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})


class CaseMismatchError(InputError, ValueError):
    """`do_lower_case` disagrees with the released checkpoint named by `init_checkpoint`.

    An `InputError` (the CLI prints it on one line) and, like the original's exception, a `ValueError`.
    """


# ---------------------------------------------------------------------------------------------------------
# Text helpers and vocabulary (original module-level functions)
# ---------------------------------------------------------------------------------------------------------


def validate_case_matches_checkpoint(do_lower_case: bool, init_checkpoint: str | None) -> None:
    """Check that `do_lower_case` suits a released checkpoint, judged by its directory name.

    Does nothing when `init_checkpoint` is empty or is not of the form `.../<model_name>/bert_model.ckpt...`,
    or when the model name is not one of the released BERT models (WWM and small models are not checked).

    Args:
        do_lower_case: the value of the `--do_lower_case` flag.
        init_checkpoint: the `--init_checkpoint` path, e.g. `.../uncased_L-12_H-768_A-12/bert_model.ckpt`.

    Raises:
        CaseMismatchError: the flag contradicts the checkpoint's casing; the message names the flag value
            to pass instead.
    """
    if not init_checkpoint:
        return
    # Same pattern as the original: the directory right before `bert_model.ckpt` is the model name.
    m = re.match("^.*?([A-Za-z0-9_-]+)/bert_model.ckpt", init_checkpoint)
    if m is None:
        return
    model_name = m.group(1)
    if model_name in _LOWER_CASED_MODELS and not do_lower_case:
        kind, wanted = "lower-cased (uncased)", True
    elif model_name in _CASED_MODELS and do_lower_case:
        kind, wanted = "cased", False
    else:
        return
    raise CaseMismatchError(
        f"--do_lower_case={do_lower_case} does not match --init_checkpoint={init_checkpoint}: "
        f"'{model_name}' is a {kind} model, so pass --do_lower_case={wanted} to tokenize the way it was "
        f"pre-trained (if you are sure this check is wrong, skip validate_case_matches_checkpoint)"
    )


def convert_to_unicode(text: str | bytes) -> str:
    """Return `text` as `str`; bytes are decoded as UTF-8 and invalid bytes are silently dropped."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8", "ignore")
    raise ValueError(f"Unsupported string type: {type(text)}")


def printable_text(text: str | bytes) -> str:
    """Return `text` in a form suitable for logging (a `str`; under Python 3 the same as `convert_to_unicode`)."""
    return convert_to_unicode(text)


def read_texts(lines: Iterable[bytes], name: str, errors: str = "strict") -> Iterator[str]:
    """Texts of an input stream: each line is plain text, or a JSON object whose "text" field is the text.

    `errors`: "strict" raises `InputError` on bytes that are not UTF-8, naming the line; "ignore" drops
    them (the original's `convert_to_unicode`); "replace" substitutes U+FFFD.
    """
    for lineno, raw in enumerate(lines, start=1):
        line = decode_line(raw, name, lineno, errors) if isinstance(raw, bytes) else raw
        if lineno == 1 and line.startswith("\ufeff"):
            line = line[1:]
        line = line[:-1] if line.endswith("\n") else line
        line = line[:-1] if line.endswith("\r") else line
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                obj = None
            if isinstance(obj, dict) and "text" in obj:
                text = obj["text"]
                if not isinstance(text, str):
                    raise InputError(
                        f'{name} line {lineno}: field "text" must be a string, got {type(text).__name__}; '
                        f"fix the JSON line or pass it as plain text"
                    )
                yield text
                continue
        yield line


def load_vocab(vocab_file: str | os.PathLike) -> collections.OrderedDict[str, int]:
    """Read a WordPiece vocabulary: one token per line, id = line number (from 0).

    The file is always read as UTF-8, whatever the platform's locale. Each line is `str.strip()`ped, so a
    blank line is the token `""`. A token that appears twice maps to its *later* line number.

    Args:
        vocab_file: path of `vocab.txt`.

    Returns:
        An ordered mapping token -> id, in file order.

    Raises:
        InputError: the file does not exist or is not UTF-8.
    """
    try:
        with open(vocab_file, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InputError(
            f"vocab file '{os.fspath(vocab_file)}' not found: pass the vocab.txt of your model "
            f"(e.g. --vocab_file=uncased_L-12_H-768_A-12/vocab.txt)"
        ) from None
    except IsADirectoryError:
        raise InputError(
            f"vocab file '{os.fspath(vocab_file)}' is a directory: pass the vocab.txt file inside it"
        ) from None
    try:
        data = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InputError(
            f"vocab file '{os.fspath(vocab_file)}' line {line}: not valid UTF-8; "
            f"re-save the vocabulary as UTF-8 text, one token per line"
        ) from None
    # Lines end at "\n" only (as TF's GFile reads them); a "\r" before it goes with `strip()`.
    lines = data.split("\n")
    if lines[-1] == "":
        lines.pop()  # the text after the final newline is not a line
    vocab: collections.OrderedDict[str, int] = collections.OrderedDict()
    for index, token in enumerate(lines):
        vocab[token.strip()] = index
    return vocab


def convert_by_vocab(vocab: Mapping[Any, Any], items: Iterable[Any]) -> list[Any]:
    """Map every item through `vocab`; an unknown item raises `KeyError` (no `[UNK]` fallback)."""
    return [vocab[item] for item in items]


def convert_tokens_to_ids(vocab: Mapping[str, int], tokens: Iterable[str]) -> list[int]:
    """Token strings -> ids; `KeyError` on a token not in `vocab`."""
    return convert_by_vocab(vocab, tokens)


def convert_ids_to_tokens(inv_vocab: Mapping[int, str], ids: Iterable[int]) -> list[str]:
    """Ids -> token strings; `KeyError` on an id not in `inv_vocab`."""
    return convert_by_vocab(inv_vocab, ids)


def whitespace_tokenize(text: str) -> list[str]:
    """Strip, then split on runs of whitespace (Python's `str.split()`, so any Unicode whitespace)."""
    text = text.strip()
    if not text:
        return []
    return text.split()


# ---------------------------------------------------------------------------------------------------------
# Character classes (reference definitions)
# ---------------------------------------------------------------------------------------------------------


def _is_whitespace(char: str) -> bool:
    """Space, tab, newline, carriage return, or any Unicode space separator (category Zs)."""
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char: str, legacy: bool = False) -> bool:
    """Control or format character (Cc, Cf); tab, newline and carriage return count as whitespace instead.

    Args:
        char: one character.
        legacy: the rule before 2019-03-28 (commit d66a146): every category starting with "C" (also
            private use Co, unassigned Cn and surrogates Cs). Vocabularies built before then used it.
    """
    if char in ("\t", "\n", "\r"):
        return False
    cat = unicodedata.category(char)
    if legacy:
        return cat.startswith("C")
    return cat in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    """Any Unicode punctuation (category P*), or any non-alphanumeric printable ASCII character.

    The ASCII ranges make `$`, `+`, `<`, `=`, `>`, `^`, `` ` ``, `|` and `~` punctuation even though Unicode
    files them as symbols (S*).
    """
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    """True for a code point in one of the CJK Unified Ideographs blocks of `_CJK_RANGES`."""
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


# ---------------------------------------------------------------------------------------------------------
# Fast-path tables: the character classes above as compiled regular expressions
# ---------------------------------------------------------------------------------------------------------


def _category_runs() -> list[tuple[str, int, int]]:
    """[(category, first, last)] for maximal runs of equal Unicode category over all code points."""
    cats = list(map(unicodedata.category, map(chr, range(sys.maxunicode + 1))))
    runs = []
    start = 0
    for cat, group in itertools.groupby(cats):
        n = len(list(group))
        runs.append((cat, start, start + n - 1))
        start += n
    return runs


def _char_class(ranges: Iterable[tuple[int, int]], negate: bool = False, extra: str = "") -> str:
    """A regex character class `[...]` for inclusive code-point ranges, plus `extra` (e.g. `\\s`)."""
    parts = [f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in sorted(ranges)]
    return "[" + ("^" if negate else "") + "".join(parts) + extra + "]"


def _without(ranges: list[tuple[int, int]], points: Iterable[int]) -> list[tuple[int, int]]:
    """`ranges` with the given code points removed."""
    out = list(ranges)
    for p in points:
        nxt = []
        for lo, hi in out:
            if lo <= p <= hi:
                if lo < p:
                    nxt.append((lo, p - 1))
                if p < hi:
                    nxt.append((p + 1, hi))
            else:
                nxt.append((lo, hi))
        out = nxt
    return out


_BMP_MAX = 0xFFFF
_ASTRAL = "\\U00010000-\\U0010ffff"
_WS = r"\s"  # in a `str` pattern: exactly the characters `str.isspace()` (and so `str.split()`) uses


def _split_bmp(ranges: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the part of `ranges` inside the Basic Multilingual Plane, the part above it)."""
    bmp = [(lo, min(hi, _BMP_MAX)) for lo, hi in ranges if lo <= _BMP_MAX]
    astral = [(max(lo, _BMP_MAX + 1), hi) for lo, hi in ranges if hi > _BMP_MAX]
    return bmp, astral


def _one_of(ranges: list[tuple[int, int]]) -> str:
    """Pattern for one character in `ranges`, quick on every text.

    `re` tests BMP characters against a bitmap but walks a list for each range above U+FFFF, so a class
    with many astral ranges is slow on *every* character it rejects. The astral part is therefore only
    consulted behind a cheap lookahead for an astral character.
    """
    bmp, astral = _split_bmp(ranges)
    if not astral:
        return _char_class(bmp)
    return f"(?:{_char_class(bmp)}|(?=[{_ASTRAL}]){_char_class(astral)})"


def _none_of(ranges: list[tuple[int, int]], extra: str = "") -> str:
    """Pattern for one character outside `ranges` and outside the class body `extra` (see `_one_of`)."""
    bmp, astral = _split_bmp(ranges)
    return (
        f"(?:{_char_class(bmp, negate=True, extra=extra + _ASTRAL)}"
        f"|(?=[{_ASTRAL}]){_char_class(astral, negate=True, extra=extra)})"
    )


@dataclass(frozen=True)
class _CharTables:
    """Compiled patterns equivalent to the reference character predicates, for one control-char rule.

    Each pattern comes twice: `*_bmp` for texts without characters above U+FFFF (one bitmap test per
    character, the common case) and `*_any` for all texts (see `_one_of`).
    """

    astral: re.Pattern  # one character above U+FFFF
    remove_bmp: re.Pattern  # one char `_clean_text` drops: NUL, U+FFFD, `_is_control`
    remove_any: re.Pattern
    cjk: re.Pattern  # one `_is_chinese_char` char
    mark_bmp: re.Pattern  # one char of category Mn (dropped by `_run_strip_accents`)
    mark_any: re.Pattern
    split_bmp: re.Pattern  # findall -> each punctuation char, each maximal run of other non-whitespace
    split_any: re.Pattern


@functools.cache
def _char_tables(legacy_control_chars: bool) -> _CharTables:
    runs = _category_runs()
    if legacy_control_chars:
        control = [(lo, hi) for cat, lo, hi in runs if cat.startswith("C")]
    else:
        control = [(lo, hi) for cat, lo, hi in runs if cat in ("Cc", "Cf")]
    remove = _without(control, (0x09, 0x0A, 0x0D)) + [(0, 0), (0xFFFD, 0xFFFD)]
    punct = [(lo, hi) for cat, lo, hi in runs if cat.startswith("P")]
    punct += [(33, 47), (58, 64), (91, 96), (123, 126)]
    marks = [(lo, hi) for cat, lo, hi in runs if cat == "Mn"]
    punct_bmp = _split_bmp(punct)[0]
    return _CharTables(
        astral=re.compile(f"[{_ASTRAL}]"),
        remove_bmp=re.compile(_char_class(_split_bmp(remove)[0])),
        remove_any=re.compile(_one_of(remove)),
        cjk=re.compile(_char_class(_CJK_RANGES)),
        mark_bmp=re.compile(_char_class(_split_bmp(marks)[0])),
        mark_any=re.compile(_one_of(marks)),
        split_bmp=re.compile(f"{_char_class(punct_bmp)}|{_char_class(punct_bmp, negate=True, extra=_WS)}+"),
        split_any=re.compile(f"{_one_of(punct)}|{_none_of(punct, extra=_WS)}+"),
    )


# The same for ASCII-only text: ASCII characters `_clean_text` removes (Cc minus tab, newline, carriage
# return), and the split into punctuation characters and runs of other non-whitespace characters.
_ASCII_REMOVE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ASCII_SPLIT = re.compile(r"[!-/:-@\[-`{-~]|[^\s!-/:-@\[-`{-~]+")
_WORD_RUNS = re.compile("[^ \t\n\r]+")  # what `_is_whitespace` always separates
_PRINTABLE_ASCII = re.compile("[!-~]+")  # nothing `_clean_text` removes, no whitespace


class _Memo(dict):
    """A dict that fills itself: a missing key is computed by `fn`, stored and returned.

    Lookups of known keys stay in C (`dict.__getitem__`), which is what makes the fast path fast.
    When `limit` entries are reached the memo is emptied, which bounds memory on endless new keys.
    """

    def __init__(self, fn: Callable[[str], Any], limit: int) -> None:
        super().__init__()
        self.fn = fn
        self.limit = limit

    def __missing__(self, key: str) -> Any:
        value = self.fn(key)
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


# ---------------------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------------------


class BasicTokenizer:
    """Cleaning, CJK splitting, (optional) lower-casing and accent stripping, punctuation splitting.

    Args:
        do_lower_case: lower-case and strip accents (NFD, then drop Mn marks, not recomposed).
        tokenize_chinese_chars: surround CJK ideographs with spaces (original: always on).
        never_split: chunks (whitespace-delimited, after cleaning) passed through untouched, e.g.
            `["[MASK]", "[SEP]"]`. Not in the original, which splits `[MASK]` into `[`, `mask`, `]`.
        legacy_control_chars: remove every category starting with "C" (pre-2019-03 rule), not only Cc/Cf.
        strip_accents: strip accents independently of `do_lower_case`; None (default) follows it.
        fast: use the fast path (identical output); False selects the reference port.
    """

    def __init__(
        self,
        do_lower_case: bool = True,
        *,
        tokenize_chinese_chars: bool = True,
        never_split: Iterable[str] | None = None,
        legacy_control_chars: bool = False,
        strip_accents: bool | None = None,
        fast: bool = True,
    ) -> None:
        self.do_lower_case = do_lower_case
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.never_split = frozenset(never_split or ())
        self.legacy_control_chars = legacy_control_chars
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents
        self.fast = fast
        if fast:
            self._tables = _char_tables(legacy_control_chars)

    def tokenize(self, text: str | bytes) -> list[str]:
        """Tokenize `text` into basic tokens (words and single punctuation characters)."""
        if self.fast:
            return self._tokenize_fast(convert_to_unicode(text))
        return self._tokenize_reference(convert_to_unicode(text))

    def tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int]]:
        """`tokenize(text)` with the span `text[start:end]` each token comes from, as (token, start, end).

        The original pipeline works on the cleaned, lower-cased and accent-stripped text, so its tokens
        lose their positions. Here each character of `text` is normalized on its own and keeps its index:
        whitespace ends a word, a character `_clean_text` drops belongs to no token (and splits nothing), a
        CJK ideograph and a character whose normalized form is punctuation are tokens of their own, and
        every other character extends the current word. This gives the same token boundaries as the
        whole-chunk pipeline: lower-casing and NFD act per character except for Greek final sigma (a letter
        either way) and for reordering combining marks (dropped, or never split). A span covers the
        characters of its token, including combining marks that accent stripping removed.
        """
        if self.never_split:
            raise ValueError("tokenize_with_offsets does not support never_split")
        if text.isascii() and _ASCII_REMOVE.search(text) is None:  # the usual case, in one pass
            found = _ASCII_SPLIT.finditer(text)
            return [(m.group().lower() if self.do_lower_case else m.group(), m.start(), m.end()) for m in found]
        tokens = self.tokenize(text)
        spans: list[tuple[int, int]] = []
        # " \t\n\r" end a word whatever surrounds them, so each run between them is split on its own: printable
        # ASCII (lower-casing keeps each character where it is, nothing decomposes) in one pass, the rest
        # character by character.
        for run in _WORD_RUNS.finditer(text):
            chunk, base = run.group(), run.start()
            if _PRINTABLE_ASCII.fullmatch(chunk):
                spans.extend((base + m.start(), base + m.end()) for m in _ASCII_SPLIT.finditer(chunk))
            else:
                spans.extend((base + a, base + b) for a, b in self._spans_by_character(chunk))
        if len(spans) != len(tokens):
            raise ValueError(f"could not align {len(tokens)} tokens with {len(spans)} spans of {text!r}")
        return [(token, a, b) for token, (a, b) in zip(tokens, spans)]

    def _spans_by_character(self, text: str) -> list[tuple[int, int]]:
        """The (start, end) of each basic token of `text`, found one character at a time."""
        spans: list[tuple[int, int]] = []
        word_open = False  # whether the last span is a word that the next letter extends
        for i, char in enumerate(text):
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char, self.legacy_control_chars):
                continue
            if char.isspace():  # what `whitespace_tokenize` splits on, after `_clean_text`
                word_open = False
                continue
            if self.tokenize_chinese_chars and _is_chinese_char(cp):
                spans.append((i, i + 1))
                word_open = False
                continue
            normalized = char.lower() if self.do_lower_case else char
            if self.strip_accents:
                normalized = self._run_strip_accents(normalized)
            for c in normalized:
                if _is_punctuation(c):
                    spans.append((i, i + 1))
                    word_open = False
                elif word_open:
                    spans[-1] = (spans[-1][0], i + 1)
                else:
                    spans.append((i, i + 1))
                    word_open = True
            if not normalized and word_open:  # a stripped combining mark stays with its word
                spans[-1] = (spans[-1][0], i + 1)
        return spans

    # --- reference path (a plain port of the original) ------------------------------------------------

    def _tokenize_reference(self, text: str) -> list[str]:
        text = self._clean_text(text)
        if self.tokenize_chinese_chars:
            text = self._tokenize_chinese_chars(text)
        split_tokens = []
        for token in whitespace_tokenize(text):
            if token in self.never_split:
                split_tokens.append(token)
                continue
            if self.do_lower_case:
                token = token.lower()
            if self.strip_accents:
                token = self._run_strip_accents(token)
            split_tokens.extend(self._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(split_tokens))

    def _run_strip_accents(self, text: str) -> str:
        """NFD-decompose, then drop non-spacing marks (Mn). The result is not recomposed."""
        text = unicodedata.normalize("NFD", text)
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    def _run_split_on_punc(self, text: str) -> list[str]:
        """Split off every punctuation character as its own token; other runs stay together."""
        if text in self.never_split:
            return [text]
        pieces: list[list[str]] = []
        new_word = True
        for char in text:
            if _is_punctuation(char):
                pieces.append([char])
                new_word = True
            else:
                if new_word:
                    pieces.append([])
                    new_word = False
                pieces[-1].append(char)
        return ["".join(p) for p in pieces]

    def _tokenize_chinese_chars(self, text: str) -> str:
        """Put a space before and after every CJK ideograph."""
        out: list[str] = []
        for char in text:
            if self._is_chinese_char(ord(char)):
                out.extend((" ", char, " "))
            else:
                out.append(char)
        return "".join(out)

    def _is_chinese_char(self, cp: int) -> bool:
        """True for a code point in a CJK Unified Ideographs block (not Hangul or kana)."""
        return _is_chinese_char(cp)

    def _clean_text(self, text: str) -> str:
        """Drop NUL, U+FFFD and control characters; replace each whitespace character by one space."""
        out = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char, self.legacy_control_chars):
                continue
            out.append(" " if _is_whitespace(char) else char)
        return "".join(out)

    # --- fast path ------------------------------------------------------------------------------------

    def _tokenize_fast(self, text: str) -> list[str]:
        """The reference pipeline on the whole text at once, each step one call into C.

        The original lower-cases, strips accents and splits punctuation chunk by chunk, after splitting on
        whitespace. Doing it on the whole text gives the same tokens because whitespace characters are
        left unchanged by those steps and never interact with their neighbours: `str.lower()` looks at
        context only for a final sigma, and whitespace is neither cased nor case-ignorable; NFD reorders
        only runs of combining marks, and whitespace is a starter (combining class 0). Whitespace is not
        mapped to " " either: `str.split()` and `\\s` separate on every `_is_whitespace` character, and on
        U+2028/U+2029, which the original's own `str.split()` separates on too. Tests check these facts
        for every code point.
        """
        tables = self._tables
        is_ascii = text.isascii()
        if is_ascii:
            remove, mark, split = _ASCII_REMOVE, None, _ASCII_SPLIT
        elif tables.astral.search(text) is None:
            remove, mark, split = tables.remove_bmp, tables.mark_bmp, tables.split_bmp
        else:
            remove, mark, split = tables.remove_any, tables.mark_any, tables.split_any
        if remove.search(text) is not None:
            text = remove.sub("", text)
        if not is_ascii and self.tokenize_chinese_chars and tables.cjk.search(text) is not None:
            text = tables.cjk.sub(r" \g<0> ", text)
        if not self.never_split:
            return self._normalize_and_split(text, is_ascii, mark, split)
        out = []  # never_split chunks bypass lower-casing and splitting, so go chunk by chunk
        for chunk in text.split():
            if chunk in self.never_split:
                out.append(chunk)
            else:
                out.extend(self._normalize_and_split(chunk, is_ascii, mark, split))
        return out

    def _normalize_and_split(self, text: str, is_ascii: bool, mark: re.Pattern | None, split: re.Pattern) -> list[str]:
        if self.do_lower_case:
            text = text.lower()
        if self.strip_accents and not is_ascii:  # ASCII has no decompositions and no marks
            text = unicodedata.normalize("NFD", text)
            assert mark is not None  # set whenever strip_accents is
            if mark.search(text) is not None:
                text = mark.sub("", text)
        return split.findall(text)


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece over a fixed vocabulary.

    Args:
        vocab: token -> id mapping. With `fast=True` it must not change after construction.
        unk_token: the token emitted for a word that cannot be covered by vocab pieces.
        max_input_chars_per_word: longer words (in code points) become `unk_token` (100 before 2018-11-23).
        fast: memoise per word and search forwards through prefix tables (identical output).
        cache_size: entries of the fast path's memo before it is emptied.
    """

    def __init__(
        self,
        vocab: Mapping[str, int],
        unk_token: str = "[UNK]",
        max_input_chars_per_word: int = 200,
        *,
        fast: bool = True,
        cache_size: int = _DEFAULT_CACHE_SIZE,
    ) -> None:
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word
        self.fast = fast
        if fast:
            self._head_prefixes, self._tail_prefixes = _prefix_tables(vocab)
            self._word_memo = _Memo(self._tokenize_word_fast, cache_size)

    def tokenize(self, text: str | bytes) -> list[str]:
        """Split each whitespace-separated word of `text` into word pieces.

        For example `"unaffable"` -> `["un", "##aff", "##able"]` with a suitable vocab.
        """
        words = whitespace_tokenize(convert_to_unicode(text))
        if self.fast:
            return list(itertools.chain.from_iterable(map(self._word_memo.__getitem__, words)))
        out: list[str] = []
        for word in words:
            out.extend(self._tokenize_word_reference(word))
        return out

    def _tokenize_word_reference(self, word: str) -> list[str]:
        chars = list(word)
        if len(chars) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces = []
        start = 0
        while start < len(chars):
            end = len(chars)
            found = None
            while start < end:  # shrink the candidate from the right until it is in the vocab
                candidate = "".join(chars[start:end])
                if start > 0:
                    candidate = "##" + candidate
                if candidate in self.vocab:
                    found = candidate
                    break
                end -= 1
            if found is None:  # one uncoverable position makes the whole word unknown
                return [self.unk_token]
            pieces.append(found)
            start = end
        return pieces

    def _tokenize_word_fast(self, word: str) -> tuple[str, ...]:
        if len(word) > self.max_input_chars_per_word:
            return (self.unk_token,)
        ends: list[int] = []
        if self._greedy_ids(word, ends) is None:
            return (self.unk_token,)
        pieces = [word[: ends[0]]]
        pieces += ["##" + word[a:b] for a, b in zip(ends, ends[1:])]
        return tuple(pieces)

    def _greedy_ids(self, word: str, ends: list[int] | None = None) -> list | None:
        """Vocab values of the greedy pieces of `word`, or None when some position matches no piece.

        The reference search run forwards: the longest vocab piece starting at `start` is found by growing
        the candidate while it is still a prefix of some vocab entry, remembering the longest candidate
        that is an entry. Same pieces, in O(piece length) lookups instead of O(word length). The piece
        end positions are appended to `ends` when given. The length limit is the caller's to check.
        """
        table = self._head_prefixes
        value = table.get(word)
        if value is not None and value is not _NOT_AN_ENTRY:  # the whole word is in the vocab
            if ends is not None:
                ends.append(len(word))
            return [value]
        n = len(word)
        values = []
        start = 0
        while start < n:
            best = 0
            end = start + 1
            while end <= n:
                value = table.get(word[start:end])
                if value is None:  # no vocab entry starts with this candidate: stop growing
                    break
                if value is not _NOT_AN_ENTRY:
                    best, best_value = end, value
                end += 1
            if not best:
                return None
            values.append(best_value)
            if ends is not None:
                ends.append(best)
            start = best
            table = self._tail_prefixes
        return values


# Value of a prefix table entry that is a prefix of vocab entries but not an entry itself.
_NOT_AN_ENTRY = object()


def _prefix_tables(vocab: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Prefix tables for the forward WordPiece search: {prefix: its vocab value, or `_NOT_AN_ENTRY`}.

    The head table covers every entry (a word's first piece is looked up as is); the tail table covers
    entries starting with "##", keyed without the "##" (later pieces are looked up as "##" + piece).
    """
    head: dict[str, Any] = {}
    tail: dict[str, Any] = {}
    for token, value in vocab.items():
        for table, entry in ((head, token), (tail, token[2:] if token.startswith("##") else None)):
            if entry is None:
                continue
            for i in range(1, len(entry)):
                table.setdefault(entry[:i], _NOT_AN_ENTRY)
            table[entry] = value
    return head, tail


class FullTokenizer:
    """Basic tokenization followed by WordPiece: the tokenizer every BERT script uses.

    Args:
        vocab_file: path of `vocab.txt` (or an already loaded token -> id mapping).
        do_lower_case: True for uncased models (lower-case + strip accents), False for cased models.
        tokenize_chinese_chars: see `BasicTokenizer`.
        never_split: see `BasicTokenizer` (opt-in; the original has no special-token protection).
        legacy_control_chars: see `BasicTokenizer` (pre-2019-03 control-character rule).
        strip_accents: see `BasicTokenizer`; None follows `do_lower_case`.
        fast: True (default) for the memoised fast path, False for the reference port. Same output.
        cache_size: entries per fast-path memo before it is emptied.
    """

    def __init__(
        self,
        vocab_file: str | os.PathLike | Mapping[str, int],
        do_lower_case: bool = True,
        *,
        tokenize_chinese_chars: bool = True,
        never_split: Iterable[str] | None = None,
        legacy_control_chars: bool = False,
        strip_accents: bool | None = None,
        fast: bool = True,
        cache_size: int = _DEFAULT_CACHE_SIZE,
    ) -> None:
        if isinstance(vocab_file, Mapping):
            self.vocab = collections.OrderedDict(vocab_file)
            self._vocab_name = "the vocabulary"
        else:
            self.vocab = load_vocab(vocab_file)
            self._vocab_name = f"vocab file {os.fspath(vocab_file)}"
        self.inv_vocab = {v: k for k, v in self.vocab.items()}
        self.fast = fast
        self.basic_tokenizer = BasicTokenizer(
            do_lower_case=do_lower_case,
            tokenize_chinese_chars=tokenize_chinese_chars,
            never_split=never_split,
            legacy_control_chars=legacy_control_chars,
            strip_accents=strip_accents,
            fast=fast,
        )
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab, fast=fast, cache_size=cache_size)
        self._init_kwargs = dict(
            do_lower_case=do_lower_case,
            tokenize_chinese_chars=tokenize_chinese_chars,
            never_split=sorted(self.basic_tokenizer.never_split) or None,
            legacy_control_chars=legacy_control_chars,
            strip_accents=strip_accents,
            cache_size=cache_size,
        )
        if fast:
            # basic token -> ids of its word pieces (the pieces themselves are memoised by WordPiece)
            self._word_ids_memo = _Memo(self._word_ids, cache_size)

    def tokenizer_config(self) -> dict[str, Any]:
        """The settings that decide the output, for saving beside a model (`tokenizer_config.json`)."""
        bt = self.basic_tokenizer
        return {
            "do_lower_case": bt.do_lower_case,
            "tokenize_chinese_chars": bt.tokenize_chinese_chars,
            "strip_accents": bt.strip_accents,
            "legacy_control_chars": bt.legacy_control_chars,
            "never_split": sorted(bt.never_split),
        }

    # --- the original API -----------------------------------------------------------------------------

    def tokenize(self, text: str | bytes) -> list[str]:
        """Word-piece tokens of `text`, e.g. `"UNwant\\u00e9d,running"` -> `un ##want ##ed , runn ##ing`."""
        if self.fast:
            words = self.basic_tokenizer._tokenize_fast(convert_to_unicode(text))
            return list(itertools.chain.from_iterable(map(self.wordpiece_tokenizer._word_memo.__getitem__, words)))
        out: list[str] = []
        for token in self.basic_tokenizer.tokenize(text):
            out.extend(self.wordpiece_tokenizer.tokenize(token))
        return out

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Token strings -> ids; `KeyError` on a token not in the vocab (`InputError` when that token is the
        `[UNK]` that WordPiece gave an unknown word and the vocab lacks it)."""
        try:
            return convert_by_vocab(self.vocab, tokens)
        except KeyError as e:
            if e.args and e.args[0] == self.wordpiece_tokenizer.unk_token:
                raise self._no_unk_error() from None
            raise

    def _no_unk_error(self) -> InputError:
        unk = self.wordpiece_tokenizer.unk_token
        return InputError(
            f"{self._vocab_name} has no {unk} token, and the text has a word its pieces cannot spell; "
            f"add a line {unk} to the vocabulary (every BERT vocab.txt has one)"
        )

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Ids -> token strings; `KeyError` on an unknown id."""
        return convert_by_vocab(self.inv_vocab, ids)

    # --- additions: direct ids and batches ------------------------------------------------------------

    def encode(self, text: str | bytes) -> list[int]:
        """Ids of `text`'s word pieces; the same as `convert_tokens_to_ids(tokenize(text))`."""
        if self.fast:
            words = self.basic_tokenizer._tokenize_fast(convert_to_unicode(text))
            return list(itertools.chain.from_iterable(map(self._word_ids_memo.__getitem__, words)))
        return self.convert_tokens_to_ids(self.tokenize(text))

    def tokenize_with_offsets(self, text: str) -> list[tuple[str, int, int, int]]:
        """Word pieces of `text` with their ids and the span of `text` each comes from: (piece, id, start, end).

        The pieces and ids are `tokenize(text)` and `encode(text)`: each basic token of
        `BasicTokenizer.tokenize_with_offsets` is split by WordPiece as `tokenize` splits it. A piece's
        span is its share of its word's span when lower-casing and accent stripping kept the word's length
        (the usual case), else the whole word's span (e.g. "ﬁ", one character that normalizes to two).
        """
        out = []
        for word, start, end in self.basic_tokenizer.tokenize_with_offsets(text):
            if self.fast:
                pieces, ids = self.wordpiece_tokenizer._word_memo[word], self._word_ids_memo[word]
            else:
                pieces = self.wordpiece_tokenizer.tokenize(word)
                ids = self.convert_tokens_to_ids(pieces)
            exact = end - start == len(word) and list(pieces) != [self.wordpiece_tokenizer.unk_token]
            pos = start
            for piece, piece_id in zip(pieces, ids):
                if exact:
                    length = len(piece) - 2 if piece.startswith("##") else len(piece)
                    out.append((piece, piece_id, pos, pos + length))
                    pos += length
                else:
                    out.append((piece, piece_id, start, end))
        return out

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of word-piece ids: pieces joined by spaces, a `##` piece joined to the one before it.

        Lower-casing, accents and the whitespace between words are not recovered; `skip_special_tokens`
        leaves out [PAD], [UNK], [CLS], [SEP] and [MASK]. `KeyError` on an id outside the vocabulary.
        """
        words: list[str] = []
        for token in self.convert_ids_to_tokens(ids):
            if skip_special_tokens and token in SPECIAL_TOKENS:
                continue
            if token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
        return " ".join(words)

    def tokenize_batch(self, texts: Iterable[str | bytes]) -> list[list[str]]:
        """`[tokenize(t) for t in texts]`, with the per-call overhead hoisted out of the loop."""
        if not self.fast:
            return [self.tokenize(t) for t in texts]
        return self._map_words(texts, self.wordpiece_tokenizer._word_memo)

    def encode_batch(self, texts: Sequence[str | bytes], num_workers: int = 1) -> list[list[int]]:
        """`[encode(t) for t in texts]`, the fastest way to turn many texts into ids.

        Args:
            texts: the texts.
            num_workers: > 1 spreads a large batch (at least 8000 texts) over that many worker processes,
                forked where the platform allows (they start with this tokenizer's memo; what they add
                to it is not brought back). It pays off only with idle cores; the default (1) stays in
                this process.
        """
        if not self.fast:
            return [self.encode(t) for t in texts]
        if num_workers > 1 and len(texts) >= 4 * _MIN_TEXTS_PER_TASK:
            return _encode_in_processes(self, texts, num_workers)
        return self._map_words(texts, self._word_ids_memo)

    def _map_words(self, texts: Iterable[str | bytes], memo: _Memo) -> list[list]:
        """For each text: basic tokens, each replaced by its memoised pieces or ids, flattened.

        The cyclic garbage collector is paused meanwhile: nothing made here can form a reference cycle,
        yet the many new lists would trigger collections that walk every object of the process.
        """
        get = memo.__getitem__
        basic = self.basic_tokenizer._tokenize_fast
        chain = itertools.chain.from_iterable
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return [list(chain(map(get, basic(t if isinstance(t, str) else convert_to_unicode(t))))) for t in texts]
        finally:
            if gc_was_enabled:
                gc.enable()

    # --- fast-path memo filler -------------------------------------------------------------------------

    def _word_ids(self, word: str) -> tuple[int, ...]:
        wordpiece = self.wordpiece_tokenizer
        if len(word) <= wordpiece.max_input_chars_per_word:
            ids = wordpiece._greedy_ids(word)  # the vocab values are the ids
            if ids is not None:
                return tuple(ids)  # a tuple of ints is left alone by the garbage collector
        try:
            return (self.vocab[wordpiece.unk_token],)
        except KeyError:
            raise self._no_unk_error() from None


# ---------------------------------------------------------------------------------------------------------
# Process pool for very large batches
# ---------------------------------------------------------------------------------------------------------

_MIN_TEXTS_PER_TASK = 2000
# What worker processes work on. Forked workers inherit it, with the parent's filled memos; spawned
# workers build their own tokenizer in `_init_worker` and receive their texts with each task.
_WORKER_STATE: tuple[FullTokenizer, Sequence[str | bytes]] | None = None


def _init_worker(vocab: Mapping[str, int], kwargs: dict[str, Any]) -> None:
    global _WORKER_STATE
    _WORKER_STATE = (FullTokenizer(vocab, fast=True, **kwargs), ())


def _encode_span(task: tuple[int, int, Sequence[str | bytes] | None]) -> list[list[int]]:
    start, stop, texts = task
    assert _WORKER_STATE is not None
    tok, shared_texts = _WORKER_STATE
    part = shared_texts[start:stop] if texts is None else texts
    return tok._map_words(part, tok._word_ids_memo)


def _encode_in_processes(tok: FullTokenizer, texts: Sequence[str | bytes], num_workers: int) -> list[list[int]]:
    global _WORKER_STATE
    n_tasks = max(num_workers, min(4 * num_workers, len(texts) // _MIN_TEXTS_PER_TASK))
    step = -(-len(texts) // n_tasks)
    spans = [(i, min(i + step, len(texts))) for i in range(0, len(texts), step)]
    if "fork" in multiprocessing.get_all_start_methods():
        _WORKER_STATE = (tok, texts)
        try:
            with multiprocessing.get_context("fork").Pool(num_workers) as pool:
                parts = pool.map(_encode_span, [(a, b, None) for a, b in spans], chunksize=1)
        finally:
            _WORKER_STATE = None
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(num_workers, initializer=_init_worker, initargs=(tok.vocab, tok._init_kwargs)) as pool:
            parts = pool.map(_encode_span, [(a, b, list(texts[a:b])) for a, b in spans], chunksize=1)
    return [ids for part in parts for ids in part]
