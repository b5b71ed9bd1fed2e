"""`bert prepare-corpus` and its library `bert.pretraining.corpus`: Gutenberg boilerplate, paragraphs, chapters,
sentence splitting."""

import gzip

import pytest

from bert.cli import main
from bert.commands.prepare_corpus import PrepareCorpusArgs, run_prepare_corpus
from bert.pretraining.corpus import is_chapter_heading, iter_documents, iter_paragraphs, strip_gutenberg

WRAPPED = """\
It is a truth universally acknowledged, that a single man in possession
of a good fortune, must be in want of a wife. However little known the
feelings or views of such a man may be on his first entering a
neighbourhood, this truth is so well fixed in the minds of the surrounding
families.

"My dear Mr. Bennet," said his lady to him one day, "have you heard that
Netherfield Park is let at last?"
"""

BOOK = (
    "The Project Gutenberg EBook of A Test, by Nobody\n"
    "This eBook is for the use of anyone anywhere at no cost.\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK A TEST ***\n"
    "\n"
    "CHAPTER I\n"
    "\n"
    "The first chapter begins here. It has two sentences in one wrapped\n"
    "paragraph that goes on for a while, long enough to be wrapped here.\n"
    "\n"
    "Mr. Smith went to Washington. He came back.\n"
    "\n"
    "CHAPTER II.\n"
    "\n"
    "The second chapter is short.\n"
    "\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK A TEST ***\n"
    "Updated editions will replace the previous one.\n"
)


def test_strip_gutenberg_drops_header_and_footer():
    lines = BOOK.split("\n")
    kept = list(strip_gutenberg(lines))
    assert kept[0] == "" and kept[1] == "CHAPTER I"
    assert not any("Gutenberg" in line or "Updated editions" in line for line in kept)


def test_strip_gutenberg_without_markers_keeps_everything():
    lines = ["one", "two", "", "three"]
    assert list(strip_gutenberg(lines)) == lines


def test_strip_gutenberg_old_style_end_line():
    lines = ["text", "End of the Project Gutenberg EBook of Emma", "license"]
    assert list(strip_gutenberg(lines)) == ["text"]


@pytest.mark.parametrize(
    "line,expected",
    [
        ("CHAPTER I", True),
        ("Chapter 12: The Storm", True),
        ("  CHAPTER XLII.", True),
        ("CHAPTER THE FIRST", True),
        ("Chapter Twenty-One", True),
        ("Chapter one of the story was long and dull and the reader slept through it all " * 2, False),
        ("Chapters of this book", False),
        ("The chapter I liked", False),
        ("Chapter I'd rather forget", False),
    ],
)
def test_is_chapter_heading(line, expected):
    assert is_chapter_heading(line) is expected


def test_wrapped_lines_are_joined_into_paragraphs():
    paras = list(iter_paragraphs(WRAPPED.split("\n"), mode="auto"))
    assert len(paras) == 2
    assert paras[0].startswith("It is a truth") and paras[0].endswith("surrounding families.")
    assert "possession of a good" in paras[0]  # the line break became a space


def test_short_line_ends_a_paragraph_without_blank_lines():
    # Some books (e.g. Richardson's Pamela here) have no blank lines: a short line ends a paragraph.
    text = [
        "I, too, have written a long letter, but will say one thing more; and that",
        "is, that, in the midst of our poverty and misfortunes, we have trusted in",
        "bring our grey hairs to the grave at once.",
        "If, then, you love us, if you wish for God's blessing, and your own",
        "future happiness, we both charge you to stand upon your guard.",
    ]
    paras = list(iter_paragraphs(text, mode="blank_line"))
    assert len(paras) == 2
    assert paras[0].endswith("grave at once.")


def test_line_mode_makes_each_line_a_paragraph():
    text = ["A" * 300 + ".", "B" * 200 + ".", "", "C."]
    assert list(iter_paragraphs(text, mode="auto")) == ["A" * 300 + ".", "B" * 200 + ".", "C."]


def test_chapters_split_documents_and_headings_are_dropped():
    paras = list(iter_paragraphs(list(strip_gutenberg(BOOK.split("\n"))), split_chapters=True))
    docs = list(iter_documents(paras, lambda p: [p]))
    assert len(docs) == 2
    assert all("CHAPTER" not in s for d in docs for s in d)
    assert docs[1] == ["The second chapter is short."]


def test_iter_documents_cleans_whitespace_and_drops_empty_sentences():
    docs = list(iter_documents(["a\tb\u2028c", None, None, "d"], lambda p: [p, "  "]))
    assert docs == [["a b c"], ["d"]]


def test_prepare_corpus_on_a_gz_book(tmp_path):
    pytest.importorskip("pysbd")
    src = tmp_path / "book.txt.gz"
    src.write_bytes(gzip.compress(BOOK.encode()))
    out = tmp_path / "out" / "corpus.txt"
    result = run_prepare_corpus(PrepareCorpusArgs(input_file=str(src), output_file=str(out), split_chapters=True))
    text = out.read_text()
    docs = [d.split("\n") for d in text.strip("\n").split("\n\n")]
    assert result["documents"] == len(docs) == 2
    assert docs[0] == [
        "The first chapter begins here.",
        "It has two sentences in one wrapped paragraph that goes on for a while, long enough to be wrapped here.",
        "Mr. Smith went to Washington.",  # pysbd knows "Mr." is not a sentence end
        "He came back.",
    ]
    assert "Gutenberg" not in text


def test_prepare_corpus_cli_one_document_per_file_gz_output(tmp_path):
    pytest.importorskip("pysbd")
    for i in range(2):
        (tmp_path / f"b{i}.txt").write_text(f"Book {i} starts. It ends.\n")
    out = tmp_path / "corpus.txt.gz"
    assert main(["prepare-corpus", f"--input_file={tmp_path}/b*.txt", f"--output_file={out}"]) == 0
    assert gzip.decompress(out.read_bytes()).decode() == "Book 0 starts.\nIt ends.\n\nBook 1 starts.\nIt ends.\n\n"


def test_prepare_corpus_blingfire_splitter(tmp_path):
    pytest.importorskip("blingfire")
    (tmp_path / "b.txt").write_text("One sentence here. Another one there!\n")
    out = tmp_path / "c.txt"
    run_prepare_corpus(
        PrepareCorpusArgs(input_file=str(tmp_path / "b.txt"), output_file=str(out), sentence_splitter="blingfire")
    )
    assert out.read_text() == "One sentence here.\nAnother one there!\n\n"


def test_prepare_corpus_empty_input_is_an_error_and_writes_nothing(tmp_path, capsys):
    pytest.importorskip("pysbd")
    (tmp_path / "empty.txt").write_text("\n\n   \n")
    out = tmp_path / "c.txt"
    assert main(["prepare-corpus", f"--input_file={tmp_path}/empty.txt", f"--output_file={out}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "bert prepare-corpus: error: " in err and "no sentences found" in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]
