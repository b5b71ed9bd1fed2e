"""bert.tasks.squad_evaluate against the official SQuAD evaluation scripts' own outputs (tests/fixtures/squad_eval),
and on the full official dev sets when shared/data is present."""

import collections
import gzip
import json
import logging
import re
import shlex
import string
from pathlib import Path

import pytest

from bert import cli
from bert.commands.evaluate_squad import EvaluateSquadArgs, run_evaluate_squad
from bert.errors import InputError
from bert.tasks.squad_evaluate import (
    evaluate_v1,
    evaluate_v2,
    find_best_thresh,
    get_raw_scores_v1,
    get_raw_scores_v2,
    make_qid_to_has_ans,
)
from conftest import shared_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "squad_eval"


def load(name):
    with open(FIXTURES / name, encoding="utf-8") as f:
        return json.load(f)


def assert_same_eval(got, expected):
    assert list(got) == list(expected)  # the official keys in the official order
    for key, value in expected.items():
        if key.endswith("_thresh") or key.endswith("total"):
            assert got[key] == value and type(got[key]) is type(value), key
        else:
            assert got[key] == pytest.approx(value, abs=1e-9), key


# --------------------------------------------------------------------------------------------------
# Fixtures made by the official scripts


def test_v1_totals():
    got = evaluate_v1(load("dataset_v1.1.json")["data"], load("predictions_v1.1.json"))
    assert_same_eval(got, load("eval_v1.1.json"))


def test_v1_unanswered_message(caplog):
    with caplog.at_level(logging.WARNING, logger="bert.tasks.squad_evaluate"):
        evaluate_v1(load("dataset_v1.1.json")["data"], load("predictions_v1.1.json"))
    expected = (FIXTURES / "eval_v1.1.stderr.txt").read_text().strip()
    assert [r.getMessage() for r in caplog.records] == [expected]
    messages = []
    evaluate_v1(load("dataset_v1.1.json")["data"], load("predictions_v1.1.json"), warn=messages.append)
    assert messages == ["Unanswered question 56e17644e3433e1400422f40 will receive score 0."]


@pytest.mark.parametrize(
    "expected_file, use_na, thresh",
    [
        ("eval_v2.0_no_na_prob.json", False, 1.0),
        ("eval_v2.0.json", True, 1.0),
        ("eval_v2.0_thresh0.5.json", True, 0.5),
    ],
)
def test_v2_totals(expected_file, use_na, thresh):
    na_probs = load("na_probs_v2.0.json") if use_na else None
    got = evaluate_v2(load("dataset_v2.0.json")["data"], load("predictions_v2.0.json"), na_probs, thresh)
    assert isinstance(got, collections.OrderedDict)
    assert_same_eval(got, load(expected_file))


def test_v1_per_question():
    expected = load("per_question_v1.1.json")
    exact, f1 = get_raw_scores_v1(load("dataset_v1.1.json")["data"], load("predictions_v1.1.json"))
    assert set(expected) == set(exact) | {"56e17644e3433e1400422f40"}
    for qid, e in expected.items():
        if e["kind"] == "missing":
            assert qid not in exact
            continue
        assert exact[qid] == pytest.approx(e["exact"], abs=1e-12), qid
        assert f1[qid] == pytest.approx(e["f1"], abs=1e-12), qid
    assert {e["kind"] for e in expected.values()} >= {"exact", "partial_shorter", "partial_longer", "wrong_span"}


def test_v2_per_question():
    expected = load("per_question_v2.0.json")
    exact, f1 = get_raw_scores_v2(load("dataset_v2.0.json")["data"], load("predictions_v2.0.json"))
    assert list(exact) == list(expected)
    for qid, e in expected.items():
        assert exact[qid] == pytest.approx(e["exact"], abs=1e-12), qid
        assert f1[qid] == pytest.approx(e["f1"], abs=1e-12), qid


def _official_commands():
    """(argv for `bert evaluate-squad`, expected stdout file, expected stderr file or None) per commands.txt line."""
    out = []
    for line in (FIXTURES / "commands.txt").read_text().splitlines():
        if not line.strip():
            continue
        stderr_file = None
        m = re.search(r"\(stderr -> (\S+)\)", line)
        if m:
            stderr_file = m.group(1)
            line = line[: m.start()]
        command, _, stdout_file = line.partition(">")
        words = shlex.split(command)
        assert words[0] == "python" and words[1].startswith("evaluate-v")
        out.append((["evaluate-squad", *words[2:]], stdout_file.strip(), stderr_file))
    return out


@pytest.mark.parametrize("argv, stdout_file, stderr_file", _official_commands())
def test_cli_output_is_byte_identical(argv, stdout_file, stderr_file, capsys, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == (FIXTURES / stdout_file).read_text()
    if stderr_file:
        assert captured.err == (FIXTURES / stderr_file).read_text()
    else:
        assert captured.err == ""


def test_commands_file_covers_every_eval_fixture():
    covered = {stdout for _, stdout, _ in _official_commands()}
    assert covered == {p.name for p in FIXTURES.glob("eval_*.json")}


def test_cli_explicit_version_and_snake_case_flags(capsys, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    argv = ["evaluate-squad", "dataset_v2.0.json", "predictions_v2.0.json", "--version", "2.0"]
    argv += ["--na_prob_file=na_probs_v2.0.json", "--na_prob_thresh=0.5"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == (FIXTURES / "eval_v2.0_thresh0.5.json").read_text()


def test_cli_out_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    out = tmp_path / "eval.json"
    argv = ["evaluate-squad", "dataset_v2.0.json", "predictions_v2.0.json", "--na-prob-file", "na_probs_v2.0.json"]
    assert cli.main([*argv, "--out-file", str(out)]) == 0
    assert capsys.readouterr().out == ""
    # The official script writes json.dump(out_eval, f): one line, no newline at the end.
    assert out.read_text() == json.dumps(load("eval_v2.0.json"))


# --------------------------------------------------------------------------------------------------
# Thresholds


def test_best_thresh_ties_keep_na_prob_file_order():
    # a: answerable and right; b: unanswerable but answered. Both have na_prob 0.5.
    preds = {"a": "x", "b": "y"}
    scores = {"a": 1, "b": 0}
    has_ans = {"a": True, "b": False}
    # Start: all predicted no-answer -> 1 right (b). Admitting a first reaches 2 at thresh 0.5.
    assert find_best_thresh(preds, scores, {"a": 0.5, "b": 0.5}, has_ans) == (100.0, 0.5)
    # Admitting b first drops to 0, then a brings it back to 1, never above the start: thresh stays 0.0.
    assert find_best_thresh(preds, scores, {"b": 0.5, "a": 0.5}, has_ans) == (50.0, 0.0)


def test_apply_threshold_is_strictly_greater():
    data = [{"paragraphs": [{"qas": [{"id": "q", "answers": [{"text": "cat"}]}]}]}]
    assert evaluate_v2(data, {"q": "cat"}, {"q": 0.5}, 0.5)["exact"] == 100.0  # 0.5 is not > 0.5
    assert evaluate_v2(data, {"q": "cat"}, {"q": 0.51}, 0.5)["exact"] == 0.0  # predicted no-answer


# --------------------------------------------------------------------------------------------------
# Bad input


def _write(path, obj):
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8")
    return str(path)


def _run(tmp_path, dataset, preds, **kw):
    return run_evaluate_squad(
        EvaluateSquadArgs(_write(tmp_path / "d.json", dataset), _write(tmp_path / "p.json", preds), **kw)
    )


@pytest.mark.parametrize(
    "dataset, match",
    [
        ({"version": "1.1"}, '"data"'),
        ({"version": "1.1", "data": [{"title": "T"}]}, r"article 0 \('T'\) has no \"paragraphs\""),
        ({"version": "1.1", "data": [{"paragraphs": [{}]}]}, 'paragraph 0 has no "qas"'),
        ({"version": "1.1", "data": [{"paragraphs": [{"qas": [{"answers": []}]}]}]}, 'question 0 has no string "id"'),
        ({"version": "1.1", "data": [{"paragraphs": [{"qas": [{"id": "q7"}]}]}]}, 'question q7 has no "answers"'),
        ({"data": []}, "--version"),
    ],
)
def test_malformed_dataset(tmp_path, dataset, match):
    with pytest.raises(InputError, match=match) as e:
        _run(tmp_path, dataset, {})
    assert "d.json" in str(e.value) and "\n" not in str(e.value)


def test_bad_files(tmp_path):
    good = {"version": "v2.0", "data": [{"paragraphs": [{"qas": [{"id": "q", "answers": []}]}]}]}
    with pytest.raises(InputError, match="p.json: must be a JSON object"):
        _run(tmp_path, good, ["not", "an", "object"])
    with pytest.raises(InputError, match="not valid JSON"):
        _run(tmp_path, "{oops", {})
    with pytest.raises(InputError, match="nope.json: no such file"):
        run_evaluate_squad(EvaluateSquadArgs(str(tmp_path / "nope.json"), str(tmp_path / "p.json")))
    with pytest.raises(InputError, match="p.json: no answer for 1 of 1 questions"):
        _run(tmp_path, good, {})
    with pytest.raises(InputError, match="n.json: no probability"):
        _run(tmp_path, good, {"q": ""}, na_prob_file=_write(tmp_path / "n.json", {}))


def test_cli_reports_bad_input_on_one_line(tmp_path, capsys):
    argv = ["evaluate-squad", _write(tmp_path / "d.json", {"version": "1.1"}), _write(tmp_path / "p.json", {})]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bert evaluate-squad: error:") and err.count("\n") == 1


# --------------------------------------------------------------------------------------------------
# The full official dev sets


def _dev(name):
    path = shared_path("data", "squad", name)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["data"]


def _questions(data):
    return [qa for article in data for p in article["paragraphs"] for qa in p["qas"]]


def _simple_normalize(s):
    s = s.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def test_full_dev_v1():
    data = _dev("dev-v1.1.json.gz")
    qas = _questions(data)
    assert len(qas) == 10570
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in qas}
    assert evaluate_v1(data, gold) == {"exact_match": 100.0, "f1": 100.0}
    # v1.1 quirk: an empty prediction exactly matches a gold answer that normalises to nothing (3 such
    # questions in dev-v1.1, whose extra gold answer is "."), yet its F1 is 0 (no shared token).
    n_empty_gold = sum(any(not _simple_normalize(a["text"]) for a in qa["answers"]) for qa in qas)
    assert n_empty_gold == 3
    got = evaluate_v1(data, dict.fromkeys(gold, ""))
    assert got == {"exact_match": pytest.approx(100.0 * n_empty_gold / len(qas), abs=1e-9), "f1": 0.0}
    # Mix: even questions get the first gold answer; odd ones the first gold answer plus a foreign word,
    # whose best F1 is that against the first gold answer: 2n / (2n + 1) for its n normalised tokens.
    mix, expected_f1 = {}, 0.0
    for i, qa in enumerate(qas):
        first = qa["answers"][0]["text"]
        if i % 2 == 0:
            mix[qa["id"]] = first
            expected_f1 += 1.0
        else:
            mix[qa["id"]] = first + " zzqxj"
            n = len(_simple_normalize(first).split())
            expected_f1 += 2 * n / (2 * n + 1)
    got = evaluate_v1(data, mix)
    assert got["exact_match"] == pytest.approx(100.0 * ((len(qas) + 1) // 2) / len(qas), abs=1e-9)
    assert got["f1"] == pytest.approx(100.0 * expected_f1 / len(qas), abs=1e-9)


def test_full_dev_v2():
    data = _dev("dev-v2.0.json.gz")
    qas = _questions(data)
    n_has = sum(1 for qa in qas if qa["answers"])
    n_no = len(qas) - n_has
    assert (len(qas), n_no) == (11873, 5945)
    assert list(make_qid_to_has_ans(data)) == [qa["id"] for qa in qas]

    empty = evaluate_v2(data, {qa["id"]: "" for qa in qas})
    assert empty["NoAns_exact"] == 100.0 and empty["NoAns_f1"] == 100.0
    assert empty["HasAns_exact"] == 0.0 and empty["HasAns_f1"] == 0.0
    assert empty["exact"] == pytest.approx(100.0 * n_no / len(qas), abs=1e-9)
    assert (empty["total"], empty["HasAns_total"], empty["NoAns_total"]) == (len(qas), n_has, n_no)

    oracle = {qa["id"]: qa["answers"][0]["text"] if qa["answers"] else "" for qa in qas}
    assert all(evaluate_v2(data, oracle)[k] == 100.0 for k in ("exact", "f1", "HasAns_f1", "NoAns_exact"))

    # Mix by index mod 3: the first gold answer ("" if none), the empty answer, or a foreign word.
    # Right: answerable with i%3 == 0; unanswerable with i%3 in (0, 1).
    mix, right = {}, 0
    for i, qa in enumerate(qas):
        assert not qa["answers"] or _simple_normalize(qa["answers"][0]["text"])
        mix[qa["id"]] = [oracle[qa["id"]], "", "zzqxj"][i % 3]
        right += (i % 3 == 0) if qa["answers"] else (i % 3 in (0, 1))
    got = evaluate_v2(data, mix)
    assert got["exact"] == pytest.approx(100.0 * right / len(qas), abs=1e-9)
    assert got["f1"] == pytest.approx(100.0 * right / len(qas), abs=1e-9)

    # With na_probs 1.0 on every question and a 0.5 threshold, everything is predicted unanswerable;
    # the best threshold keeps every answer of the oracle and reaches 100.
    na = dict.fromkeys(oracle, 1.0)
    assert evaluate_v2(data, oracle, na, 0.5)["exact"] == pytest.approx(100.0 * n_no / len(qas), abs=1e-9)
    best = evaluate_v2(data, oracle, na, 0.5)
    assert (best["best_exact"], best["best_exact_thresh"]) == (100.0, 1.0)
