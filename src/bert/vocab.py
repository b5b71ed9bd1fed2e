"""Learning a WordPiece vocabulary from a corpus: the library of `bert build-vocab`. No torch here.

The original released its vocabularies but not the tool that built them. This module builds one that
our `FullTokenizer` (the original's `tokenization.py`) uses exactly as it uses the released files:

1. `count_words`: the original's `BasicTokenizer` over every line (cleaning, control characters dropped,
   CJK ideographs split off, lower-casing and accent stripping with `do_lower_case`, punctuation split
   off) -> how often each word occurs.
2. `choose_alphabet`: the `limit_alphabet` most frequent characters (ties broken by code point, so the
   choice is reproducible). A word with another character can only be `[UNK]`, and so can a word longer
   than `WordpieceTokenizer`'s 200 characters: such words are left out of training.
3. `train_pieces`: `tokenizers`' `WordPieceTrainer` over the remaining words, with counts. It learns pieces
   by BPE merges and writes word-internal pieces with the "##" prefix, which is what the original's
   greedy longest-match-first WordPiece looks up. Every character of the alphabet is a piece, and so is
   "##" + every character that can occur inside a word (not punctuation, not a CJK ideograph: the basic
   tokenizer always splits those off alone), so every training word can be covered and none becomes
   `[UNK]`. The "##" characters are handed to the trainer as its first tokens, in code-point order:
   otherwise it numbers them in hash order and breaks ties between equally frequent merges differently
   from run to run.
4. `vocab_layout`: the released files' layout, `[PAD]`, `[unused0]`..`[unused98]`, `[UNK]`, `[CLS]`,
   `[SEP]`, `[MASK]`, further `[unusedN]`, then the pieces: single characters, "##" characters, and the
   learned pieces in the order they were learned.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from bert.errors import InputError
from bert.tokenization import BasicTokenizer, WordpieceTokenizer, _is_chinese_char, _is_punctuation
from bert.utils import iter_lines, progress, text_size

logger = logging.getLogger(__name__)

CONTINUATION = "##"  # WordpieceTokenizer's mark of a word-internal piece
UNK = "[UNK]"
# Released vocab files put this many [unusedN] between [PAD] (id 0) and [UNK] (id 100), so that [UNK],
# [CLS], [SEP], [MASK] are ids 100-103 in every BERT model; the rest follow [MASK].
UNUSED_BEFORE_UNK = 99
_LINES_PER_BATCH = 4096
_FEED_CHARS = 1 << 16  # characters per string handed to the trainer


def vocab_layout(num_unused: int) -> list[str]:
    """The special and unused tokens that open a vocab, in the released files' order.

    `[PAD]`, `[unused0]`..`[unused98]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`, then `[unused99]` onwards:
    with 99 unused tokens (the default) ids 0-103 are those of every released BERT vocab, and with 994 the
    first 999 ids are the released uncased vocab's. With fewer than 99 the specials move down.
    """
    before = min(num_unused, UNUSED_BEFORE_UNK)
    return [
        "[PAD]",
        *(f"[unused{i}]" for i in range(before)),
        UNK,
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *(f"[unused{i}]" for i in range(before, num_unused)),
    ]


def count_words(
    files: Sequence[str], do_lower_case: bool, decode_errors: str = "strict", desc: str | None = "build-vocab"
) -> collections.Counter[str]:
    """How often each word of the basic tokenizer occurs in `files` (plain or .gz text, read line by line).

    Args:
        files: text files; the layout (one sentence per line, blank lines between documents) is not
            needed, any text will do.
        do_lower_case: lower-case and strip accents, as for an uncased model.
        decode_errors: "strict" (an error naming the file and line), "ignore" or "replace".
        desc: label of a progress bar in MB of text; None for no bar.
    """
    tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
    counts: collections.Counter[str] = collections.Counter()
    total = sum(text_size(f) for f in files)
    with progress(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc=desc, disable=desc is None) as bar:
        for path in files:
            lines = iter_lines(path, "utf-8", decode_errors)
            chars = 0
            while batch := list(itertools.islice(lines, _LINES_PER_BATCH)):
                # One call for the whole batch: words never span a newline, and each step of the basic
                # tokenizer leaves whitespace alone, so the words are those of the lines one by one.
                text = "\n".join(batch)
                counts.update(tokenizer.tokenize(text))
                chars += len(text) + 1
                bar.update(len(text) + 1)
            bar.update(max(0, text_size(path) - chars))  # characters are not bytes: end the file at its size
    return counts


def choose_alphabet(counts: Mapping[str, int], limit_alphabet: int) -> tuple[list[str], int]:
    """(the `limit_alphabet` most frequent characters in code-point order, the number of characters left out)."""
    chars: collections.Counter[str] = collections.Counter()
    for word, count in counts.items():
        for char in word:
            chars[char] += count
    ranked = sorted(chars, key=lambda c: (-chars[c], ord(c)))
    return sorted(ranked[:limit_alphabet]), max(0, len(ranked) - limit_alphabet)


def can_continue(char: str) -> bool:
    """Whether `char` can occur inside a basic token, and so needs a "##" piece."""
    return not _is_punctuation(char) and not _is_chinese_char(ord(char))


def continuation_pieces(alphabet: Sequence[str]) -> list[str]:
    """The "##" pieces of the alphabet: one for every character that can occur inside a word."""
    return [CONTINUATION + c for c in alphabet if can_continue(c)]


def trainable(word: str, alphabet: set[str], max_chars: int) -> bool:
    """Whether `word` can be tokenized into pieces at all (else the tokenizer makes it `[UNK]`)."""
    return len(word) <= max_chars and set(word) <= alphabet


def _feed(counts: Mapping[str, int]) -> Iterator[str]:
    """Each word repeated as often as it occurs, space separated, in strings of 64 k characters or more.

    The trainer takes text, not counts, so the counts are spelled out; `str * n` makes that cheap.
    """
    parts: list[str] = []
    size = 0
    for word, count in counts.items():
        item = word + " "
        per_part = max(1, _FEED_CHARS // len(item))
        while count:
            n = min(count, per_part)
            parts.append(item * n)
            size += n * len(item)
            count -= n
            if size >= _FEED_CHARS:
                yield "".join(parts)
                parts, size = [], 0
    if parts:
        yield "".join(parts)


def train_pieces(counts: Mapping[str, int], alphabet: Sequence[str], num_pieces: int, min_frequency: int) -> list[str]:
    """Learn at most `num_pieces` WordPiece pieces (alphabet included) from word counts.

    Args:
        counts: word -> occurrences; every word must be made of `alphabet` characters.
        alphabet: the characters, in code-point order.
        num_pieces: the most pieces to return, at least `len(alphabet) + len(continuation_pieces(alphabet))`.
        min_frequency: a pair of pieces occurring fewer times is not merged.

    Returns:
        single characters, "##" characters, then learned pieces in the order they were learned.
    """
    continuing = continuation_pieces(alphabet)
    trainer = trainers.WordPieceTrainer(
        vocab_size=num_pieces,
        min_frequency=min_frequency,
        show_progress=False,
        special_tokens=continuing,
        initial_alphabet=list(alphabet),
        limit_alphabet=len(alphabet),
        continuing_subword_prefix=CONTINUATION,
    )
    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
    # Python's str.split() separates on every character Rust calls whitespace (and more), so a basic
    # token is never split further here.
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(_feed(counts), trainer=trainer)
    learned = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    singles = set(alphabet) | set(continuing)
    return list(alphabet) + continuing + [t for t in learned if t not in singles]


def coverage(vocab: Mapping[str, int], counts: Mapping[str, int]) -> dict[str, Any]:
    """How the original's WordPiece splits the counted words with `vocab`: the share of words that become
    `[UNK]` and the mean number of pieces per word, both over word occurrences."""
    wordpiece = WordpieceTokenizer(vocab)
    words = unknown = pieces = 0
    for word, count in counts.items():
        word_pieces = wordpiece.tokenize(word)
        words += count
        pieces += count * len(word_pieces)
        unknown += count * (word_pieces == [UNK])
    return {
        "words": words,
        "distinct_words": len(counts),
        "unk_rate": unknown / words if words else 0.0,
        "pieces_per_word": pieces / words if words else 0.0,
    }


def build_vocab(
    files: Sequence[str],
    *,
    vocab_size: int,
    num_unused: int = UNUSED_BEFORE_UNK,
    limit_alphabet: int = 1000,
    min_frequency: int = 2,
    do_lower_case: bool = True,
    decode_errors: str = "strict",
    heldout_files: Sequence[str] = (),
    progress: bool = True,
) -> tuple[list[str], dict[str, Any]]:
    """Learn a vocabulary of at most `vocab_size` entries (specials and unused included) from `files`.

    Returns:
        (the tokens in id order, statistics: words read, alphabet, pieces, and the `coverage` of the
        training words and of `heldout_files` if given).

    Raises:
        InputError: no words in `files`, or `vocab_size` too small for the specials and the alphabet.
    """
    specials = vocab_layout(num_unused)
    start = time.time()
    counts = _count_training_words(files, do_lower_case, decode_errors, progress)
    heldout = None
    if heldout_files:
        heldout = count_words(heldout_files, do_lower_case, decode_errors, desc="held-out" if progress else None)
    read_seconds = time.time() - start

    alphabet, chars_left_out = choose_alphabet(counts, limit_alphabet)
    continuing = continuation_pieces(alphabet)
    _check_room(vocab_size, specials, alphabet, continuing)
    train_counts = _trainable_counts(counts, alphabet, read_seconds)
    start = time.time()
    pieces = train_pieces(train_counts, alphabet, vocab_size - len(specials), min_frequency)
    train_seconds = time.time() - start
    tokens = specials + pieces
    if len(set(tokens)) != len(tokens):  # cannot happen: learned pieces have no brackets
        raise RuntimeError("the trainer produced a piece equal to a special token")
    if len(tokens) < vocab_size:
        _warn_short(len(pieces), len(tokens), vocab_size, min_frequency)
    vocab = {t: i for i, t in enumerate(tokens)}
    stats: dict[str, Any] = {
        "words": counts.total(),
        "distinct_words": len(counts),
        "alphabet_size": len(alphabet),
        "characters_left_out": chars_left_out,
        "vocab_size": len(tokens),
        "special_and_unused": len(specials),
        "continuation_characters": len(continuing),
        "learned_pieces": len(pieces) - len(alphabet) - len(continuing),
        "train": coverage(vocab, counts),
        "heldout": coverage(vocab, heldout) if heldout is not None else None,
        "read_seconds": round(read_seconds, 3),
        "train_seconds": round(train_seconds, 3),
    }
    return tokens, stats


def _count_training_words(
    files: Sequence[str], do_lower_case: bool, decode_errors: str, progress: bool
) -> collections.Counter[str]:
    """`count_words` of the training files, refusing files without a word."""
    counts = count_words(files, do_lower_case, decode_errors, desc="build-vocab" if progress else None)
    if not counts:
        names = ", ".join(files) if len(files) <= 3 else f"{files[0]} and {len(files) - 1} more files"
        raise InputError(
            f"--input_file: no words in {names}: the files are empty or blank; give text files, one sentence per line"
        )
    return counts


def _check_room(vocab_size: int, specials: list[str], alphabet: list[str], continuing: list[str]) -> None:
    """The vocabulary holds at least the specials, the alphabet and its '##' characters."""
    needed = len(specials) + len(alphabet) + len(continuing)
    if vocab_size < needed:
        raise InputError(
            f"--vocab_size={vocab_size} is too small: {len(specials)} special and unused tokens, "
            f"{len(alphabet)} characters and {len(continuing)} '##' characters need "
            f"{needed}; raise --vocab_size, or lower --limit_alphabet or --num_unused"
        )


def _warn_short(pieces: int, tokens: int, vocab_size: int, min_frequency: int) -> None:
    logger.warning(
        "The corpus gave %d pieces, so the vocab has %d entries, not --vocab_size=%d: no pair of pieces "
        "left occurs --min_frequency=%d times. Set vocab_size=%d in bert_config.json, or give more text.",
        pieces,
        tokens,
        vocab_size,
        min_frequency,
        tokens,
    )


def _trainable_counts(counts: collections.Counter[str], alphabet: list[str], read_seconds: float) -> dict[str, int]:
    """The words the pieces are learned from: those of the alphabet's characters, not too long for WordPiece."""
    allowed = set(alphabet)
    max_chars = WordpieceTokenizer({}, fast=False).max_input_chars_per_word  # longer words are [UNK]
    train_counts = {w: c for w, c in counts.items() if trainable(w, allowed, max_chars)}
    logger.info(
        "Read %d words (%d distinct) in %.1f s; training on %d distinct words with %d characters",
        counts.total(),
        len(counts),
        read_seconds,
        len(train_counts),
        len(alphabet),
    )
    return train_counts
