"""`bert squad` end to end on a tiny random model and slices of the SQuAD dev sets: the output files, one
answer per question, the official evaluation recomputed from the written files, several windows per
question with identical predictions under dynamic padding and padding to --max_seq_length, and bad input
(exit 2, one line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bert.commands.squad import SquadArgs, run_squad
from bert.tasks.squad import NO_NON_NULL_SCORE_DIFF, convert_examples_to_features, read_squad_examples
from bert.tasks.squad_evaluate import evaluate_v1, evaluate_v2
from bert.tokenization import FullTokenizer
from conftest import (
    args_for,
    assert_same_weights,
    check_curves,
    cli_error,
    model_flags,
    read_metrics,
    read_results,
    read_weights,
    squad_slice,
)

MAX_SEQ_LENGTH = 128
MAX_QUERY_LENGTH = 32
DOC_STRIDE = 32


# conftest's model_files: the uncased vocab, attention dropout on.
TINY_MODEL = dict(attention_probs_dropout_prob=0.1, max_position_embeddings=MAX_SEQ_LENGTH)


def question_ids(path: Path) -> list[str]:
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    return [qa["id"] for a in data for p in a["paragraphs"] for qa in p["qas"]]


def squad_args(model_files, output_dir, **flags) -> SquadArgs:
    defaults = dict(
        max_seq_length=MAX_SEQ_LENGTH,
        max_query_length=MAX_QUERY_LENGTH,
        doc_stride=DOC_STRIDE,
        train_batch_size=8,
        predict_batch_size=16,
        num_train_epochs=1.0,
        learning_rate=1e-3,
    )
    return args_for(SquadArgs, model_files, output_dir, **{**defaults, **flags})


@pytest.fixture(scope="module")
def v1_run(model_files, tmp_path_factory):
    """Train on 40 questions of dev-v1.1 and predict on the next 40."""
    d = tmp_path_factory.mktemp("squad_v1")
    train = squad_slice("1.1", 0, 40, d / "train.json", training=True)
    predict = squad_slice("1.1", 40, 40, d / "predict.json", training=False)
    out = d / "out"
    result = run_squad(
        squad_args(model_files, out, train_file=str(train), predict_file=str(predict), do_train=True, do_predict=True)
    )
    return result, out, train, predict


def test_v1_train_and_predict(v1_run):
    result, out, train, predict = v1_run
    # num_train_steps counts questions, not windows: int(40 / 8 * 1.0).
    assert result["num_train_steps"] == 5 and result["global_step"] == 5
    for name in ("args.json", "metrics.jsonl", "checkpoint-5", "model", "predictions.json", "nbest_predictions.json"):
        assert (out / name).exists(), name
    assert not (out / "null_odds.json").exists()
    assert json.loads((out / "args.json").read_text())["command"] == "squad"
    assert read_metrics(out)[-1]["step"] == 5
    # The last checkpoint is the exported model.
    assert_same_weights(read_weights(out / "checkpoint-5"), read_weights(out / "model"))
    check_curves(out)

    qids = question_ids(predict)
    assert len(qids) == 40
    predictions = json.loads((out / "predictions.json").read_text())
    assert list(predictions) == qids  # exactly one answer per question, in file order
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert list(nbest) == qids
    contexts = {
        qa["id"]: p["context"]
        for a in json.loads(predict.read_text())["data"]
        for p in a["paragraphs"]
        for qa in p["qas"]
    }
    for qid in qids:
        entries = nbest[qid]
        assert 1 <= len(entries) <= 20
        assert all(list(e) == ["text", "probability", "start_logit", "end_logit"] for e in entries)
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
        scores = [e["start_logit"] + e["end_logit"] for e in entries]
        assert scores == sorted(scores, reverse=True)
        # The probabilities are the softmax of the n-best scores (run_squad.py, `_compute_softmax`).
        softmax = np.exp(np.array(scores) - max(scores)) / np.exp(np.array(scores) - max(scores)).sum()
        np.testing.assert_allclose([e["probability"] for e in entries], softmax, rtol=1e-6)
        assert predictions[qid] == entries[0]["text"]
        # Answers are spans of the context (lower-cased by the tokenizer, projected back to the original).
        assert predictions[qid] == "empty" or " ".join(predictions[qid].split()) in " ".join(contexts[qid].split())

    # The official v1.1 evaluation of the written predictions is what eval_results holds.
    gold = json.loads(predict.read_text())["data"]
    expected = evaluate_v1(gold, predictions)
    assert json.loads((out / "eval_results.json").read_text()) == expected
    assert result["eval"] == expected
    assert read_results(out / "eval_results.txt") == {k: str(v) for k, v in expected.items()}
    assert list(read_results(out / "eval_results.txt")) == sorted(expected)
    assert 0.0 <= expected["exact_match"] <= expected["f1"] <= 100.0


def test_several_windows_and_dynamic_padding_give_the_same_predictions(model_files, v1_run, tmp_path):
    _, trained, _, predict = v1_run
    config, vocab, _ = model_files
    # Contexts are longer than one window: several features per question.
    examples = read_squad_examples(predict, is_training=False)
    features = convert_examples_to_features(
        examples, FullTokenizer(str(vocab)), MAX_SEQ_LENGTH, DOC_STRIDE, MAX_QUERY_LENGTH, is_training=False
    )
    windows = np.bincount([f.example_index for f in features])
    assert len(features) > len(examples) and windows.max() >= 2

    outputs = {}
    for pad in (False, True):
        out = tmp_path / f"pad_{pad}"
        result = run_squad(
            squad_args(
                model_files,
                out,
                init_checkpoint=str(trained / "model"),
                predict_file=str(predict),
                do_predict=True,
                pad_to_max_seq_length=pad,
                predict_batch_size=5,
            )
        )
        assert result["predict"]["num_features"] == len(features)
        outputs[pad] = out
    assert (outputs[False] / "predictions.json").read_bytes() == (outputs[True] / "predictions.json").read_bytes()
    # The same model as the training run's own prediction.
    assert (outputs[False] / "predictions.json").read_bytes() == (trained / "predictions.json").read_bytes()
    nbest = [json.loads((outputs[p] / "nbest_predictions.json").read_text()) for p in (False, True)]
    assert list(nbest[0]) == list(nbest[1])
    for qid in nbest[0]:
        assert [e["text"] for e in nbest[0][qid]] == [e["text"] for e in nbest[1][qid]]
        a = np.array([[e["probability"], e["start_logit"], e["end_logit"]] for e in nbest[0][qid]])
        b = np.array([[e["probability"], e["start_logit"], e["end_logit"]] for e in nbest[1][qid]])
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_v2_with_negative(model_files, tmp_path):
    train = squad_slice("2.0", 0, 24, tmp_path / "train.json", training=True)
    predict = squad_slice("2.0", 24, 30, tmp_path / "predict.json", training=False)
    gold = json.loads(predict.read_text())["data"]
    has_answer = [bool(qa["answers"]) for a in gold for p in a["paragraphs"] for qa in p["qas"]]
    assert any(has_answer) and not all(has_answer)
    out = tmp_path / "out"
    result = run_squad(
        squad_args(
            model_files,
            out,
            train_file=str(train),
            predict_file=str(predict),
            do_train=True,
            do_predict=True,
            version_2_with_negative=True,
        )
    )
    assert result["global_step"] == 3  # int(24 / 8 * 1.0)
    qids = question_ids(predict)
    predictions = json.loads((out / "predictions.json").read_text())
    null_odds = json.loads((out / "null_odds.json").read_text())
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert list(predictions) == list(null_odds) == list(nbest) == qids
    for qid in qids:
        # "" iff the null score beats the best span by more than --null_score_diff_threshold (0.0).
        assert (predictions[qid] == "") == (null_odds[qid] > 0.0), qid
        assert "" in [e["text"] for e in nbest[qid]]  # v2.0 always lists the null answer
        if null_odds[qid] != NO_NON_NULL_SCORE_DIFF:
            assert any(e["text"] for e in nbest[qid])

    expected = evaluate_v2(gold, predictions, na_probs=null_odds)
    results = json.loads((out / "eval_results.json").read_text())
    assert results == dict(expected)
    for key in ("exact", "f1", "total", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert key in results, key
    for key in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"):
        assert key in results, key
    assert results["total"] == len(qids) and results["HasAns_total"] == sum(has_answer)
    # The best threshold is at least as good as the official default (no-answer when null odds > 1.0).
    assert results["best_f1"] >= results["f1"] - 1e-9 and results["best_exact"] >= results["exact"] - 1e-9


def test_max_eval_examples_predicts_and_scores_the_first_questions(model_files, tmp_path):
    """The short form (`--max_eval_examples=N`): the predict file's first N questions are predicted, and the
    official evaluation scores those (SQuAD 2.0's otherwise refuses a file with unanswered questions)."""
    predict = squad_slice("2.0", 24, 30, tmp_path / "predict.json", training=False)
    out = tmp_path / "out"
    flags = dict(predict_file=str(predict), do_predict=True, version_2_with_negative=True, max_eval_examples=5)
    run_squad(squad_args(model_files, out, **flags))
    predictions = json.loads((out / "predictions.json").read_text())
    assert list(predictions) == question_ids(predict)[:5]
    assert json.loads((out / "eval_results.json").read_text())["total"] == 5


def test_bad_input_fails_before_writing(model_files, tmp_path, capsys):
    good = squad_slice("1.1", 0, 3, tmp_path / "good.json", training=True)
    data = json.loads(good.read_text())
    no_question = json.loads(json.dumps(data))
    del no_question["data"][0]["paragraphs"][0]["qas"][1]["question"]
    (tmp_path / "no_question.json").write_text(json.dumps(no_question))
    no_answers = json.loads(json.dumps(data))
    del no_answers["data"][0]["paragraphs"][0]["qas"][0]["answers"]
    (tmp_path / "no_answers.json").write_text(json.dumps(no_answers))
    no_context = json.loads(json.dumps(data))
    del no_context["data"][0]["paragraphs"][0]["context"]
    (tmp_path / "no_context.json").write_text(json.dumps(no_context))

    out = tmp_path / "out"
    common = [*model_flags(model_files, out), f"--max_seq_length={MAX_SEQ_LENGTH}"]
    common += [f"--max_query_length={MAX_QUERY_LENGTH}"]
    train, predict = f"--train_file={good}", f"--predict_file={good}"
    cases = {
        "no do_*": ([train, predict], "At least one of `do_train` or `do_predict`"),
        "no train_file": (["--do_train", predict], "train_file"),
        "no predict_file": (["--do_predict", train], "predict_file"),
        "query too long": (["--do_predict", predict, "--max_query_length=125"], "max_query_length (125) + 3"),
        "longer than the model": (
            ["--do_predict", predict, "--max_seq_length=256"],
            "--max_seq_length=256 must be between 3 and max_position_embeddings=128 (the model's)",
        ),
        "missing file": (["--do_predict", f"--predict_file={tmp_path / 'nope.json'}"], "no such file"),
        "not JSON": (["--do_predict", f"--predict_file={model_files[1]}"], "not valid JSON"),
        "question without text": (
            ["--do_predict", f"--predict_file={tmp_path / 'no_question.json'}"],
            '"question"',
        ),
        "paragraph without context": (["--do_predict", f"--predict_file={tmp_path / 'no_context.json'}"], "context"),
        "training question without answers": (
            ["--do_train", f"--train_file={tmp_path / 'no_answers.json'}"],
            '"answers"',
        ),
        "some questions without answers": (
            ["--do_predict", f"--predict_file={tmp_path / 'no_answers.json'}"],
            'have no "answers" list',
        ),
    }
    for name, (argv, expected) in cases.items():
        err = cli_error(capsys, "squad", *common, *argv)  # the case's flags come last and win
        assert expected in err, (name, err)
        assert not (out / "predictions.json").exists() and not out.exists(), f"{name}: {out} was written"


def test_the_original_flags_and_defaults():
    from bert import cli

    parser = cli._OneLineParser(prog="bert squad")
    cli.add_dataclass_flags(parser, SquadArgs)
    # The SQuAD 2.0 command of the original README, with `python run_squad.py` replaced by `bert squad`.
    argv = "--vocab_file=v.txt --bert_config_file=c.json --init_checkpoint=m --do_train=True --train_file=t.json "
    argv += "--do_predict=True --predict_file=d.json --train_batch_size=24 --learning_rate=3e-5 "
    argv += "--num_train_epochs=2.0 --max_seq_length=384 --doc_stride=128 --output_dir=o --use_tpu=False "
    argv += "--version_2_with_negative=True --null_score_diff_threshold=-2.0 --iterations_per_loop=1000"
    args = SquadArgs(**vars(parser.parse_args(argv.split())))
    assert args.version_2_with_negative and args.null_score_diff_threshold == -2.0 and args.train_batch_size == 24
    defaults = SquadArgs(**vars(parser.parse_args(["--output_dir=o"])))
    expected = dict(
        do_lower_case=True,
        max_seq_length=384,
        doc_stride=128,
        max_query_length=64,
        do_train=False,
        do_predict=False,
        train_batch_size=32,
        predict_batch_size=8,
        learning_rate=5e-5,
        num_train_epochs=3.0,
        warmup_proportion=0.1,
        save_checkpoints_steps=1000,
        iterations_per_loop=1000,
        n_best_size=20,
        max_answer_length=30,
        use_tpu=False,
        verbose_logging=False,
        version_2_with_negative=False,
        null_score_diff_threshold=0.0,
    )
    assert {k: getattr(defaults, k) for k in expected} == expected
    # run_squad.py has no eval mode and no --data_dir.
    with pytest.raises(SystemExit):
        parser.parse_args(["--output_dir=o", "--do_eval"])
