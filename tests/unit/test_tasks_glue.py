"""bert.tasks.glue and the TASKS registry: the real GLUE files, hand-made layouts, feature conversion, errors."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from bert.errors import InputError
from bert.tasks import TASKS, get_processor, glue
from bert.tasks.generic import GenericProcessor
from bert.tasks.glue import (
    InputExample,
    MnliMismatchedProcessor,
    MnliProcessor,
    MrpcProcessor,
    PaddingInputExample,
    QqpProcessor,
    XnliProcessor,
    convert_examples_to_features,
    convert_single_example,
)
from bert.tasks.windows import convert_examples_to_windows, pool_windows, window_spans
from bert.tokenization import FullTokenizer
from conftest import FIXTURES, shared_path

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "is",
    "this",
    "jack",
    "##son",
    "##ville",
    "?",
    "no",
    "it",
    "not",
    ".",
    "the",
    "dog",
    "hairy",
    "good",
    "bad",
]


@pytest.fixture(scope="module")
def tokenizer():
    return FullTokenizer({t: i for i, t in enumerate(VOCAB)}, do_lower_case=True)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------
# The real GLUE files (counts of shared/data/README.md)

REAL = [
    ("cola", "CoLA", (8551, 1043, 1063), {"0", "1"}),
    ("sst-2", "SST-2", (67349, 872, 1821), {"0", "1"}),
    ("mrpc", "MRPC", (3668, 408, 1725), {"0", "1"}),
    ("sts-b", "STS-B", (5749, 1500, 1379), None),
    ("qnli", "QNLI", (None, 5463, 5463), {"entailment", "not_entailment"}),
    ("rte", "RTE", (2490, 277, 3000), {"entailment", "not_entailment"}),
    ("wnli", "WNLI", (635, 71, 146), {"0", "1"}),
]


@pytest.mark.parametrize("task,folder,counts,labels", REAL, ids=[r[0] for r in REAL])
def test_real_glue_files(task, folder, counts, labels):
    data_dir = shared_path("data", "glue", folder)
    processor = get_processor(task)
    sets = {
        "train": processor.get_train_examples,
        "dev": processor.get_dev_examples,
        "test": processor.get_test_examples,
    }
    for (name, read), count in zip(sets.items(), counts):
        if count is None:  # QNLI has no train.tsv here
            with pytest.raises(InputError, match="train.tsv: no such file"):
                read(data_dir)
            continue
        examples = read(data_dir)
        assert len(examples) == count, name
        assert len({e.guid for e in examples}) == count, f"{name}: guids are not unique"
        assert all(e.guid.startswith(f"{name}-") for e in examples)
        assert all(e.text_a for e in examples)
        if name == "test":
            # The placeholder label: the first label, as the original's "0" / "contradiction".
            assert {e.label for e in examples} == {processor.get_labels()[0] if labels else 0.0}
        elif labels is not None:
            assert {e.label for e in examples} == labels
            assert set(processor.get_labels()) == labels
    pair = task not in ("cola", "sst-2")
    assert all((e.text_b is not None) == pair for e in examples)


def test_stsb_labels_are_floats():
    data_dir = shared_path("data", "glue", "STS-B")
    processor = get_processor("sts-b")
    assert processor.is_regression and processor.get_labels() == [None]
    dev = processor.get_dev_examples(data_dir)
    assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in dev)
    assert dev[0] == InputExample(
        "dev-0", "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0
    )
    assert len({e.label for e in dev}) > 50  # real-valued scores, not a few classes


def test_first_mrpc_examples():
    data_dir = shared_path("data", "glue", "MRPC")
    processor = MrpcProcessor()
    assert processor.get_labels() == ["0", "1"]
    train = processor.get_train_examples(data_dir)
    # guid counts lines from 0 with the header (which holds the file's byte-order mark) as line 0.
    assert train[0] == InputExample(
        guid="train-1",
        text_a='Amrozi accused his brother, whom he called "the witness", of deliberately distorting his evidence.',
        text_b='Referring to him as only "the witness", Amrozi accused his brother of deliberately distorting his '
        "evidence.",
        label="1",
    )
    dev = processor.get_dev_examples(data_dir)
    # Quoting is off: the quote opening this field is text, and the next line is not swallowed.
    assert dev[0].text_b.startswith('"The foodservice pie business')
    test = processor.get_test_examples(data_dir)
    assert test[0].guid == "test-1" and test[0].label == "0"
    assert test[0].text_a.startswith("PCCW's chief operating officer")


def test_first_cola_examples():
    data_dir = shared_path("data", "glue", "CoLA")
    processor = get_processor("CoLA")
    train = processor.get_train_examples(data_dir)  # no header: the first line is an example
    assert train[0] == InputExample(
        "train-0", "Our friends won't buy this analysis, let alone the next one we propose.", None, "1"
    )
    test = processor.get_test_examples(data_dir)  # a header, skipped
    assert test[0] == InputExample("test-1", "Bill whistled past the house.", None, "0")


# --------------------------------------------------------------------------------------------------
# MNLI, QQP, XNLI in their real layouts (files not available here)

MNLI_TRAIN_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
    "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
)
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER.replace("label1\tgold_label", "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")
MNLI_TEST_HEADER = MNLI_TRAIN_HEADER.replace("\tlabel1\tgold_label", "")


def mnli_row(index, s1, s2, labels):
    return (
        "\t".join(
            [str(index), "31193", "31193n", "government", "( ( a ) )", "( b )", "(ROOT a)", "(ROOT b)", s1, s2, *labels]
        )
        + "\n"
    )


@pytest.fixture
def mnli_dir(tmp_path):
    write(
        tmp_path / "train.tsv",
        MNLI_TRAIN_HEADER
        + mnli_row(0, 'He said "yes.', "He agreed.", ["entailment", "entailment"])
        + mnli_row(7, "It rained.", "It was dry.", ["contradiction", "contradiction"]),
    )
    write(tmp_path / "dev_matched.tsv", MNLI_DEV_HEADER + mnli_row(9815, "a", "b", ["neutral"] * 6))
    write(tmp_path / "dev_mismatched.tsv", MNLI_DEV_HEADER + mnli_row(12, "c", "d", ["entailment"] * 5 + ["neutral"]))
    write(tmp_path / "test_matched.tsv", MNLI_TEST_HEADER + mnli_row(0, "e", "f", []))
    write(tmp_path / "test_mismatched.tsv", MNLI_TEST_HEADER + mnli_row(3, "g", "h", []))
    return tmp_path


def test_mnli(mnli_dir):
    p = MnliProcessor()
    assert p.get_labels() == ["contradiction", "entailment", "neutral"]
    train = p.get_train_examples(mnli_dir)
    assert train == [
        InputExample("train-0", 'He said "yes.', "He agreed.", "entailment"),  # guid from column 0
        InputExample("train-7", "It rained.", "It was dry.", "contradiction"),
    ]
    assert p.get_dev_examples(mnli_dir) == [InputExample("dev_matched-9815", "a", "b", "neutral")]
    assert p.get_test_examples(mnli_dir) == [InputExample("test-0", "e", "f", "contradiction")]
    mm = get_processor("mnli-mm")
    assert isinstance(mm, MnliMismatchedProcessor)
    # The label is the last column (gold_label), not label1.
    assert mm.get_dev_examples(mnli_dir) == [InputExample("dev_mismatched-12", "c", "d", "neutral")]
    assert mm.get_test_examples(mnli_dir) == [InputExample("test-3", "g", "h", "contradiction")]


def test_qqp(tmp_path):
    write(
        tmp_path / "train.tsv",
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "133273\t213221\t213222\tHow is the life?\tHow is life?\t1\n"
        "402555\t536040\t536041\tWhat is it?\tWho is it?\t0\n",
    )
    write(tmp_path / "test.tsv", "id\tquestion1\tquestion2\n0\tWhy?\tWhy not?\n")
    p = QqpProcessor()
    assert p.get_train_examples(tmp_path) == [
        InputExample("train-133273", "How is the life?", "How is life?", "1"),
        InputExample("train-402555", "What is it?", "Who is it?", "0"),
    ]
    assert p.get_test_examples(tmp_path) == [InputExample("test-0", "Why?", "Why not?", "0")]


XNLI_DEV_HEADER = (
    "language\tgold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\t"
    "sentence1\tsentence2\tpromptID\tpairID\tgenre\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\n"
)


def xnli_row(lang, label, s1, s2):
    return (
        "\t".join([lang, label, "", "", "", "", s1, s2, "1", "1", "facetoface", label, label, label, label, label])
        + "\n"
    )


def test_xnli(tmp_path):
    write(
        tmp_path / "multinli" / "multinli.train.de.tsv",
        "premise\thypo\tlabel\nEr kam.\tEr ging.\tcontradictory\nEs regnet.\tEs ist nass.\tentailment\n",
    )
    write(
        tmp_path / "xnli.dev.tsv",
        XNLI_DEV_HEADER
        + xnli_row("ar", "neutral", "x", "y")
        + xnli_row("de", "neutral", "Ja.", "Nein.")
        + xnli_row("zh", "entailment", "是", "否"),
    )
    write(tmp_path / "xnli.test.tsv", XNLI_DEV_HEADER + xnli_row("de", "entailment", "A.", "B."))
    p = XnliProcessor(language="de")
    assert p.get_train_examples(tmp_path) == [
        InputExample("train-1", "Er kam.", "Er ging.", "contradiction"),  # "contradictory" renamed
        InputExample("train-2", "Es regnet.", "Es ist nass.", "entailment"),
    ]
    # Only the rows of the language; the guid keeps the line index.
    assert p.get_dev_examples(tmp_path) == [InputExample("dev-2", "Ja.", "Nein.", "neutral")]
    assert p.get_test_examples(tmp_path) == [InputExample("test-1", "A.", "B.", "entailment")]
    assert XnliProcessor().language == "zh"  # the original's hard-coded language is the default
    assert XnliProcessor().get_dev_examples(tmp_path)[0].text_a == "是"
    with pytest.raises(InputError, match=r"xnli.dev.tsv has no rows for language 'fr'"):
        get_processor("xnli", language="fr").get_dev_examples(tmp_path)


def test_registry():
    assert {"cola", "mnli", "mrpc", "xnli"} <= set(TASKS)  # run_classifier's dict
    assert {"sst-2", "sts-b", "qqp", "qnli", "rte", "wnli", "mnli-mm", "generic"} <= set(TASKS)
    assert isinstance(get_processor("MRPC"), MrpcProcessor)
    assert isinstance(get_processor("SST2"), glue.Sst2Processor)
    assert get_processor("xnli", language="fr").language == "fr"
    with pytest.raises(InputError, match="Task not found: 'squad'; --task_name must be one of cola, mnli"):
        get_processor("squad")


# --------------------------------------------------------------------------------------------------
# Feature conversion


def test_convert_pair_with_padding(tokenizer, caplog):
    example = InputExample("dev-1", "Is this jacksonville?", "No it is not.", "1")
    with caplog.at_level(logging.INFO, logger="bert.tasks.glue"):
        f = convert_single_example(0, example, ["0", "1"], 16, tokenizer)
    # [CLS] is this jack ##son ##ville ? [SEP] no it is not . [SEP] + 2 padding
    assert f.input_ids == [2, 5, 6, 7, 8, 9, 10, 3, 11, 12, 5, 13, 14, 3, 0, 0]
    assert f.input_mask == [1] * 14 + [0] * 2
    assert f.segment_ids == [0] * 8 + [1] * 6 + [0] * 2
    assert f.label_id == 1 and f.is_real_example is True
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "*** Example ***",
        "guid: dev-1",
        "tokens: [CLS] is this jack ##son ##ville ? [SEP] no it is not . [SEP]",
        "input_ids: 2 5 6 7 8 9 10 3 11 12 5 13 14 3 0 0",
        "input_mask: " + " ".join(["1"] * 14 + ["0"] * 2),
        "segment_ids: " + " ".join(["0"] * 8 + ["1"] * 6 + ["0"] * 2),
        "label: 1 (id = 1)",
    ]


def test_truncation_pops_the_longer_side(tokenizer):
    example = InputExample("x", "is this jacksonville ?", "no it is not .", "0")  # 6 and 5 tokens
    f = convert_single_example(0, example, ["0", "1"], 10, tokenizer)
    # budget 7: pop A (6>5), B (5=5), A (5>4), B (4=4) -> A = is this jack ##son, B = no it is
    assert tokenizer.convert_ids_to_tokens(f.input_ids) == [
        "[CLS]",
        "is",
        "this",
        "jack",
        "##son",
        "[SEP]",
        "no",
        "it",
        "is",
        "[SEP]",
    ]
    assert f.segment_ids == [0] * 6 + [1] * 4


def test_single_sentence_truncation_and_unknown_words(tokenizer):
    f = convert_single_example(7, InputExample("x", "the hairy dog is good", None, "1"), ["0", "1"], 5, tokenizer)
    assert tokenizer.convert_ids_to_tokens(f.input_ids) == ["[CLS]", "the", "hairy", "dog", "[SEP]"]
    assert f.segment_ids == [0] * 5 and f.input_mask == [1] * 5
    f = convert_single_example(7, InputExample("x", "the cat", "", "0"), ["0", "1"], 6, tokenizer)
    # An empty text_b is no pair; an unknown word is [UNK].
    assert f.input_ids == [2, 15, 1, 3, 0, 0] and f.label_id == 0


def test_only_first_five_are_logged(tokenizer, caplog):
    examples = [InputExample(f"t-{i}", "the dog", None, "0") for i in range(8)]
    with caplog.at_level(logging.INFO, logger="bert.tasks.glue"):
        convert_examples_to_features(examples, ["0", "1"], 8, tokenizer)
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("*** Example ***") == 5
    assert "guid: t-4" in messages and "guid: t-5" not in messages
    assert messages[0] == "Writing example 0 of 8"


def test_unpadded_features_have_the_same_ids(tokenizer):
    examples = [
        InputExample("a", "is this jacksonville ?", "no it is not .", "1"),
        InputExample("b", "the dog", None, "0"),
        InputExample("c", "the hairy dog is not good . the dog is bad", None, "0"),
    ]
    padded = convert_examples_to_features(examples, ["0", "1"], 12, tokenizer)
    unpadded = convert_examples_to_features(examples, ["0", "1"], 12, tokenizer, pad=False)
    for p, u in zip(padded, unpadded):
        n = sum(p.input_mask)
        assert len(u.input_ids) == n and u.input_mask == [1] * n
        assert (u.input_ids, u.segment_ids, u.label_id) == (p.input_ids[:n], p.segment_ids[:n], p.label_id)
    assert [len(u.input_ids) for u in unpadded] == [12, 4, 12]
    arrays = glue.features_to_arrays(unpadded)
    assert arrays["input_ids"].shape == (3, 12) and arrays["input_ids"].dtype == np.int64
    np.testing.assert_array_equal(arrays["input_ids"], [p.input_ids for p in padded])
    np.testing.assert_array_equal(arrays["input_mask"], [p.input_mask for p in padded])
    np.testing.assert_array_equal(arrays["label_ids"], [1, 0, 0])
    short = glue.features_to_arrays(unpadded[1:2])
    assert short["input_ids"].tolist() == [[2, 15, 16, 3]]


def test_regression_and_padding_examples(tokenizer):
    f = convert_single_example(9, InputExample("s", "the dog", "the dog", 3.8), [None], 8, tokenizer)
    assert f.label_id == 3.8 and isinstance(f.label_id, float)
    arrays = glue.features_to_arrays([f])
    assert arrays["label_ids"].dtype == np.float32
    pad = convert_single_example(0, PaddingInputExample(), ["0", "1"], 6, tokenizer)
    assert (pad.input_ids, pad.input_mask, pad.segment_ids) == ([0] * 6, [0] * 6, [0] * 6)
    assert pad.label_id == 0 and pad.is_real_example is False


def test_conversion_errors(tokenizer):
    with pytest.raises(InputError, match=r"example dev-3: label 'maybe' is not one of \['0', '1'\]"):
        convert_single_example(0, InputExample("dev-3", "the dog", None, "maybe"), ["0", "1"], 8, tokenizer)
    with pytest.raises(InputError, match="--max_seq_length=2 leaves no room"):
        convert_single_example(0, InputExample("x", "the", "dog", "0"), ["0", "1"], 2, tokenizer)


# --------------------------------------------------------------------------------------------------
# Step arithmetic and output files


# --------------------------------------------------------------------------------------------------
# Bad input


def test_row_with_missing_columns(tmp_path):
    write(tmp_path / "train.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta\tb\n0\t3\tonly three\n")
    with pytest.raises(InputError) as e:
        MrpcProcessor().get_train_examples(tmp_path)
    message = str(e.value)
    assert message.startswith(str(tmp_path / "train.tsv") + ":3: expected at least 5 tab-separated columns, found 3")
    assert "fix or remove this line" in message


def test_label_not_in_label_list(tmp_path):
    write(tmp_path / "dev.tsv", "gj04\t1\t\tThe dog barked.\ngj04\t2\t\tThe cat.\n")
    with pytest.raises(InputError, match=r"dev.tsv:2: label '2' \(column 2\) is not one of \['0', '1'\]"):
        get_processor("cola").get_dev_examples(tmp_path)


def test_bad_regression_label(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    write(tmp_path / "train.tsv", header + "0\tg\tf\t2012\t1\tnone\tnone\tA.\tB.\thigh\n")
    with pytest.raises(InputError, match=r"train.tsv:2: label 'high' \(column 10\) is not a finite number"):
        get_processor("sts-b").get_train_examples(tmp_path)
    write(tmp_path / "train.tsv", header + "0\tg\tf\t2012\t1\tnone\tnone\tA.\tB.\tnan\n")
    with pytest.raises(InputError, match=r"train.tsv:2: label 'nan' \(column 10\) is not a finite number"):
        get_processor("sts-b").get_train_examples(tmp_path)


def test_empty_and_header_only_files(tmp_path):
    write(tmp_path / "train.tsv", "")
    with pytest.raises(InputError, match=r"train.tsv is empty; it should hold the train examples of MRPC"):
        MrpcProcessor().get_train_examples(tmp_path)
    write(tmp_path / "dev.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n\n")
    with pytest.raises(InputError, match="dev.tsv has a header line but no examples"):
        MrpcProcessor().get_dev_examples(tmp_path)


def test_test_file_without_header(tmp_path):
    write(tmp_path / "test.tsv", "0\tBill whistled past the house.\n1\tThe car honked.\n")
    with pytest.raises(InputError) as e:
        get_processor("cola").get_test_examples(tmp_path)
    message = str(e.value)
    assert "test.tsv:1: expected the header line of the CoLA test set (columns index, sentence)" in message
    assert "add the header line" in message


def test_blank_lines_are_skipped_and_bom_dropped(tmp_path):
    (tmp_path / "train.tsv").write_bytes(b"\xef\xbb\xbfsentence\tlabel\ngood film \t1\n\nbad film\t0\n")
    assert get_processor("sst-2").get_train_examples(tmp_path) == [
        InputExample("train-1", "good film ", None, "1"),
        InputExample("train-3", "bad film", None, "0"),
    ]
    write(tmp_path / "test.tsv", "\ufeffindex\tsentence\n0\tok\n")  # a BOM before the header is fine
    assert get_processor("sst-2").get_test_examples(tmp_path)[0].text_a == "ok"


def test_read_tsv_keeps_quotes(tmp_path):
    path = write(tmp_path / "x.tsv", 'a\t"b\nc"\td\n')
    assert MrpcProcessor._read_tsv(path) == [["a", '"b'], ['c"', "d"]]


# --------------------------------------------------------------------------------------------------
# Generic processor


def test_generic_tsv_with_header_and_names(tmp_path):
    write(tmp_path / "train.tsv", 'id\ttext\tlabel\n1\tgreat\tpos\n2\tawful\tneg\n3\t"fine"\tneutral\n')
    write(tmp_path / "dev.tsv", "id\ttext\tlabel\n9\tok\tneutral\n")
    write(tmp_path / "test.tsv", "id\ttext\n4\tmeh\n")
    p = GenericProcessor(text_a_column="text", label_column="label", has_header=True)
    train = p.get_train_examples(tmp_path)
    assert train[2] == InputExample("train-4", '"fine"', None, "neutral")  # guid = line number
    assert p.get_labels() == ["neg", "neutral", "pos"]  # sorted by default
    assert p.get_dev_examples(tmp_path) == [InputExample("dev-2", "ok", None, "neutral")]
    assert p.get_test_examples(tmp_path) == [InputExample("test-2", "meh", None, "neg")]  # placeholder label
    first_seen = GenericProcessor("text", "label", has_header=True, label_order="first-seen")
    # get_labels reads the training file of the last data_dir used.
    first_seen.get_dev_examples(tmp_path)
    assert first_seen.get_labels() == ["pos", "neg", "neutral"]


def test_generic_csv_pairs_without_header(tmp_path):
    write(tmp_path / "train.csv", 'yes,"A, b",c\nno,"quoted ""x""",y\n')
    p = GenericProcessor(1, 0, 2, train_file="train.csv", label_list=["no", "yes"])
    assert p.get_train_examples(tmp_path) == [
        InputExample("train-1", "A, b", "c", "yes"),
        InputExample("train-2", 'quoted "x"', "y", "no"),
    ]
    assert p.get_labels() == ["no", "yes"]
    write(tmp_path / "dev.csv", "maybe,a,b\n")
    with pytest.raises(InputError, match=r"dev.csv:1: label 'maybe' \(column 0\) is not one of \['no', 'yes'\]"):
        GenericProcessor(1, 0, 2, dev_file="dev.csv", label_list=["no", "yes"]).get_dev_examples(tmp_path)
    write(tmp_path / "bad.csv", "yes,only\n")
    with pytest.raises(InputError, match="bad.csv:1: expected at least 3 comma-separated columns, found 2"):
        GenericProcessor(1, 0, 2, train_file="bad.csv").get_train_examples(tmp_path)


def test_generic_jsonl_and_regression(tmp_path):
    rows = [{"q": "a", "p": "b", "score": 1.5}, {"q": "c", "p": "d", "score": 4}]
    write(tmp_path / "train.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    p = GenericProcessor("q", "score", "p", is_regression=True, train_file="train.jsonl")
    assert p.get_train_examples(tmp_path) == [
        InputExample("train-1", "a", "b", 1.5),
        InputExample("train-2", "c", "d", 4.0),
    ]
    assert p.get_labels() == [None]
    labels = GenericProcessor("q", "score", train_file="train.jsonl")
    labels.get_train_examples(tmp_path)
    assert labels.get_labels() == ["1.5", "4"]  # non-string labels as their JSON text
    write(tmp_path / "dev.jsonl", '{"q": "x"}\n')
    with pytest.raises(InputError, match=r"dev.jsonl:1: the object has no key 'score'"):
        GenericProcessor("q", "score", dev_file="dev.jsonl", label_list=["1"]).get_dev_examples(tmp_path)
    write(tmp_path / "dev.jsonl", '{"q": "x", "score": 1}\n[1, 2]\n')
    with pytest.raises(InputError, match=r"dev.jsonl:2: expected a JSON object per line, found list"):
        GenericProcessor("q", "score", dev_file="dev.jsonl", label_list=["1"]).get_dev_examples(tmp_path)


def test_generic_errors(tmp_path):
    with pytest.raises(InputError, match="the label list is unknown"):
        GenericProcessor().get_labels()
    write(tmp_path / "train.tsv", "a\tb\n")
    with pytest.raises(InputError, match="column 'text' is a name but the file has no header line"):
        GenericProcessor("text", 1).get_train_examples(tmp_path)
    write(tmp_path / "train.tsv", "sentence\tlabel\nx\t1\n")
    with pytest.raises(InputError, match=r"train.tsv:1: the header has no column 'text'"):
        GenericProcessor("text", "label", has_header=True).get_train_examples(tmp_path)
    with pytest.raises(InputError, match="unknown file type '.xlsx'"):
        GenericProcessor(train_file="train.xlsx").get_train_examples(tmp_path)
    write(tmp_path / "empty.tsv", "")
    with pytest.raises(InputError, match="empty.tsv is empty"):
        GenericProcessor(train_file="empty.tsv").get_train_examples(tmp_path)


# --------------------------------------------------------------------------------------------------
# Long documents: windows and their pooling

LONG = "the dog is good the dog is bad the dog is hairy"  # 12 pieces: 15 16 5 18 15 16 5 19 15 16 5 17


def test_window_spans():
    spans = window_spans
    assert spans(12, 0, 8, 4) == (0, [(0, 6), (4, 6), (8, 4)])  # room 8 - 2; run_squad's doc_spans loop
    assert spans(12, 0, 8, 100) == (0, [(0, 6), (6, 6)])  # a stride beyond the window: no overlap
    assert spans(5, 0, 8, 4) == (0, [(0, 5)])  # fits: one window
    assert spans(0, 0, 8, 4) == (0, [(0, 0)])  # empty text_a: one empty window
    assert spans(12, 4, 12, 4) == (4, [(0, 5), (4, 5), (8, 4)])  # text_b whole: room 12 - 3 - 4
    assert spans(2, 12, 12, 4) == (7, [(0, 2)])  # text_b cut to what text_a leaves, as truncate
    assert spans(12, 12, 12, 4) == (4, [(0, 5), (4, 5), (8, 4)])  # both long: text_b keeps half the room
    with pytest.raises(InputError, match="doc_stride=0 must be at least 1"):
        spans(12, 0, 8, 0)
    with pytest.raises(InputError, match="--max_seq_length=2 leaves no room for windows"):
        spans(12, 0, 2, 1)


def test_windows_of_a_long_document(tokenizer, caplog):
    examples = [InputExample("a", LONG, None, "good"), InputExample("b", "the dog", None, "bad")]
    with caplog.at_level(logging.INFO, logger="bert.tasks.glue"):
        features = convert_examples_to_windows(examples, ["bad", "good"], 8, tokenizer, doc_stride=4)
    assert [f.input_ids for f in features] == [
        [2, 15, 16, 5, 18, 15, 16, 3],  # pieces 0..5
        [2, 15, 16, 5, 19, 15, 16, 3],  # pieces 4..9
        [2, 15, 16, 5, 17, 3, 0, 0],  # pieces 8..11, padded
        [2, 15, 16, 3, 0, 0, 0, 0],
    ]
    assert [f.input_mask for f in features][2] == [1, 1, 1, 1, 1, 1, 0, 0]
    assert all(f.segment_ids == [0] * 8 for f in features)
    assert [f.example_index for f in features] == [0, 0, 0, 1]
    assert [f.label_id for f in features] == [1, 1, 1, 0]  # every window has its example's label
    assert sum("*** Example ***" in r.getMessage() for r in caplog.records) == 4
    unpadded = convert_examples_to_windows(examples, ["bad", "good"], 8, tokenizer, 4, pad=False)
    assert unpadded[2].input_ids == [2, 15, 16, 5, 17, 3]


def test_windows_of_a_pair_keep_text_b_in_each(tokenizer):
    example = InputExample("p", LONG, "is it good ?", "good")  # text_b: 5 12 18 10
    features = convert_examples_to_windows([example], ["bad", "good"], 12, tokenizer, doc_stride=4)
    assert [f.input_ids for f in features] == [
        [2, 15, 16, 5, 18, 15, 3, 5, 12, 18, 10, 3],
        [2, 15, 16, 5, 19, 15, 3, 5, 12, 18, 10, 3],
        [2, 15, 16, 5, 17, 3, 5, 12, 18, 10, 3, 0],
    ]
    assert features[2].segment_ids == [0] * 6 + [1] * 5 + [0]


def test_windows_of_examples_that_fit_are_the_truncate_features(tokenizer):
    examples = [
        InputExample("1", "is this jacksonville ?", "no it is not .", "0"),
        InputExample("2", "the dog", LONG, "1"),  # text_b cut as truncate cuts it
        InputExample("3", "the dog is hairy", None, "1"),
    ]
    for pad in (True, False):
        truncated = convert_examples_to_features(examples, ["0", "1"], 16, tokenizer, pad=pad)
        windows = convert_examples_to_windows(examples, ["0", "1"], 16, tokenizer, 4, pad=pad)
        assert [f.example_index for f in windows] == [0, 1, 2]
        assert len(truncated[1].input_ids) == 16 and sum(truncated[1].input_mask) == 16  # example 2 was cut
        for f in windows:
            f.example_index = None
        assert windows == truncated


def test_truncate_features_are_unchanged_on_real_pairs():
    """`convert_examples_to_features` gives the ids recorded before windows and multi-label were added
    (MRPC dev pairs at max_seq_length 24: most are truncated)."""
    expected = json.loads((FIXTURES / "tasks" / "mrpc_dev_features_24.json").read_text())
    tok = FullTokenizer(shared_path("data", "vocab", "uncased.txt"), do_lower_case=True)
    examples = MrpcProcessor().get_dev_examples(shared_path("data", "glue", "MRPC"))[: len(expected)]
    features = convert_examples_to_features(examples, ["0", "1"], 24, tok)
    assert [[f.input_ids, f.input_mask, f.segment_ids, f.label_id] for f in features] == expected


def test_pool_windows():
    outputs = [np.array([1.0, -2.0]), np.array([3.0, 0.0]), np.array([5.0, 5.0]), np.array([0.0, 4.0])]
    windows = [glue.InputFeatures([], [], [], 0, example_index=i) for i in (0, 0, 1, 0)]
    np.testing.assert_allclose(pool_windows(outputs, windows, 2, "mean"), [[4 / 3, 2 / 3], [5, 5]])
    np.testing.assert_allclose(pool_windows(outputs, windows, 2, "max"), [[3, 4], [5, 5]])
    single = [glue.InputFeatures([], [], [], 0) for _ in outputs]  # truncate: one feature per example
    np.testing.assert_allclose(pool_windows(outputs, single, 4, "mean"), np.stack(outputs))
    with pytest.raises(ValueError, match="some missing"):
        pool_windows(outputs, windows, 3, "mean")


# --------------------------------------------------------------------------------------------------
# Multi-label


def test_multi_label_tsv(tmp_path, tokenizer):
    write(tmp_path / "train.tsv", "a\tsports, politics\nb\tpolitics\nc\tart,art,\n")
    write(tmp_path / "dev.tsv", "d\tart,sports\n")
    write(tmp_path / "test.tsv", "e\tanything\n")
    p = GenericProcessor(multi_label=True)
    train = p.get_train_examples(tmp_path)
    assert p.get_labels() == ["art", "politics", "sports"]  # the sorted union
    # Spaces stripped, repeats and empty entries dropped, in label-list order.
    assert [e.label for e in train] == [["politics", "sports"], ["politics"], ["art"]]
    assert p.get_dev_examples(tmp_path)[0].label == ["art", "sports"]
    assert p.get_test_examples(tmp_path)[0].label == []  # the placeholder: no label
    features = convert_examples_to_features(train, p.get_labels(), 8, tokenizer)
    assert [f.label_id for f in features] == [[0, 1, 1], [0, 1, 0], [1, 0, 0]]
    arrays = glue.features_to_arrays(features)
    assert arrays["label_ids"].dtype == np.float32 and arrays["label_ids"].shape == (3, 3)


def test_multi_label_csv_jsonl_and_separator(tmp_path):
    write(tmp_path / "train.csv", 'text,labels\n"one, two","x,y"\nthree,z\n')
    p = GenericProcessor("text", "labels", has_header=True, multi_label=True, train_file="train.csv")
    assert [(e.text_a, e.label) for e in p.get_train_examples(tmp_path)] == [("one, two", ["x", "y"]), ("three", ["z"])]
    write(tmp_path / "train.jsonl", '{"t": "a", "l": ["b", null, "a"]}\n{"t": "c", "l": "a|c"}\n{"t": "d", "l": [1]}\n')
    p = GenericProcessor("t", "l", multi_label=True, label_separator="|", train_file="train.jsonl")
    assert [e.label for e in p.get_train_examples(tmp_path)] == [["a", "b"], ["a", "c"], ["1"]]
    assert p.get_labels() == ["1", "a", "b", "c"]


def test_multi_label_errors(tmp_path):
    write(tmp_path / "train.tsv", "a\tx,y\nb\t\n")
    with pytest.raises(InputError, match=r"train.tsv:2: no label \(column -1\); a multi-label train example needs"):
        GenericProcessor(multi_label=True).get_train_examples(tmp_path)
    p = GenericProcessor(multi_label=True, allow_empty_labels=True)
    assert [e.label for e in p.get_train_examples(tmp_path)] == [["x", "y"], []]
    write(tmp_path / "dev.tsv", "c\tx\nd\ty,w\n")
    with pytest.raises(InputError, match=r"dev.tsv:2: label 'w' \(column -1\) is not one of \['x', 'y'\]"):
        p.get_dev_examples(tmp_path)
    with pytest.raises(InputError, match="either multi-label or regression"):
        GenericProcessor(multi_label=True, is_regression=True)
