"""`bert classify` with comma lists (`bert.grid`) end to end on a tiny random model and a few SST-2 rows: a 2x2 grid
run two cells at a time, its table and best cell, the best cell equal to the same run alone, a rerun that runs
nothing, a rerun that resumes an unfinished cell only, one cell at a time equal to two, and failed cells. Each cell
is a process of its own (a torch import, a few seconds), so these tests take tens of seconds."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest

from bert import grid
from bert.cli import main
from bert.commands.classify import ClassifyArgs, run_classify
from conftest import (
    args_for,
    assert_same_weights,
    cli_error,
    glue_slice,
    model_flags,
    read_weights,
    shared_path,
)

CELLS = ["bs=8,lr=0.001,ep=1", "bs=8,lr=0.001,ep=2", "bs=8,lr=0.0001,ep=1", "bs=8,lr=0.0001,ep=2"]
# eval_loss: a continuous score, so that no two cells tie (eval_accuracy over 16 rows could).
FLAGS = ["--task_name=sst-2", "--do_train", "--do_eval", "--max_seq_length=32", "--metric_for_best_model=eval_loss"]
GRID = ["--train_batch_size=8", "--learning_rate=1e-3,1e-4", "--num_train_epochs=1,2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return glue_slice(shared_path("data", "glue", "SST-2"), tmp_path_factory.mktemp("sst2"), train=32, dev=16)


def _grid(model_files, data: Path, out: Path, *extra: str) -> int:
    return main(["classify", *FLAGS, f"--data_dir={data}", *model_flags(model_files, out), *GRID, *extra])


@pytest.fixture(scope="module")
def two_at_once(model_files, data, tmp_path_factory) -> tuple[Path, str]:
    """The 2x2 grid, two cells at a time: (its output directory, what it printed)."""
    out = tmp_path_factory.mktemp("grid") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):  # the result block goes to stderr
        assert _grid(model_files, data, out, "--grid_jobs=2") == 0
    return out, printed.getvalue()


def _eval_results(directory: Path) -> dict:
    return json.loads((directory / "eval_results.json").read_text())


def test_the_table_has_every_cell_and_the_best_is_exported(two_at_once):
    out, printed = two_at_once
    record = json.loads((out / "grid_results.json").read_text())
    rows = record["cells"]
    assert [r["cell"] for r in rows] == CELLS and all(r["status"] == "ok" for r in rows)
    assert record["metric"] == "eval_loss" and record["greater_is_better"] is False
    for row in rows:
        results = _eval_results(out / "grid" / row["cell"])
        assert row["eval_loss"] == results["eval_loss"] and row["global_step"] == results["global_step"]
        assert row["global_step"] == 4 * row["num_train_epochs"]  # 32 rows / batch 8 per epoch
    best = min(rows, key=lambda r: r["eval_loss"])
    assert record["best"] == best["cell"]
    # The best cell's model and results are the grid's.
    assert_same_weights(read_weights(out / "model"), read_weights(out / "grid" / best["cell"] / "model"))
    assert (out / "eval_results.txt").read_text() == (out / "grid" / best["cell"] / "eval_results.txt").read_text()
    tsv = (out / "grid_results.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:5] == ["cell", "train_batch_size", "learning_rate", "num_train_epochs", "eval_loss"]
    assert [line.split("\t")[0] for line in tsv[1:]] == CELLS
    # The terminal shows the table, the best marked.
    assert f"* {best['cell']} " in printed and all(cell in printed for cell in CELLS)
    # args.json records the lists; each cell's its own values.
    assert json.loads((out / "args.json").read_text())["args"]["learning_rate"] == [1e-3, 1e-4]
    cell_args = json.loads((out / "grid" / CELLS[1] / "args.json").read_text())["args"]
    assert (cell_args["learning_rate"], cell_args["num_train_epochs"], cell_args["grid_jobs"]) == (1e-3, 2.0, 1)
    assert "***** Running training *****" in (out / "grid" / CELLS[1] / "log.txt").read_text()


def test_the_best_cell_is_the_same_run_alone(two_at_once, model_files, data, tmp_path, capsys):
    out, _ = two_at_once
    best = json.loads((out / "grid_results.json").read_text())["best"]
    row = next(r for r in json.loads((out / "grid_results.json").read_text())["cells"] if r["cell"] == best)
    alone = tmp_path / "alone"
    flags = dict(task_name="sst-2", data_dir=str(data), do_train=True, do_eval=True, max_seq_length=32)
    values = {k: row[k] for k in ("train_batch_size", "learning_rate", "num_train_epochs")}
    run_classify(args_for(ClassifyArgs, model_files, alone, metric_for_best_model="eval_loss", **flags, **values))
    assert _eval_results(alone) == _eval_results(out)
    assert_same_weights(read_weights(alone / "model"), read_weights(out / "model"))
    # A grid refuses a single run's directory, and a training run a grid's.
    assert "holds a single run" in cli_error(
        capsys, "classify", *FLAGS, f"--data_dir={data}", *model_flags(model_files, alone), *GRID
    )
    argv = [*FLAGS, f"--data_dir={data}", *model_flags(model_files, out)]
    assert "holds a grid of runs" in cli_error(capsys, "classify", *argv)


def test_a_rerun_of_a_finished_grid_runs_nothing(two_at_once, model_files, data, monkeypatch):
    out, _ = two_at_once
    before = {p: p.stat().st_mtime_ns for p in (out / "grid").rglob("*") if p.is_file()}
    rows = json.loads((out / "grid_results.json").read_text())["cells"]

    def no_process(*args, **kwargs):
        raise AssertionError(f"a finished cell ran again: {args}")

    monkeypatch.setattr(grid.subprocess, "run", no_process)
    assert _grid(model_files, data, out, "--grid_jobs=2") == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "grid").rglob("*") if p.is_file()} == before
    assert json.loads((out / "grid_results.json").read_text())["cells"] == rows


def test_a_rerun_runs_an_unfinished_cell_only_and_it_resumes(two_at_once, model_files, data):
    """A cell killed after its last checkpoint (its model and results not written yet): the rerun runs that cell
    alone, which resumes its finished training (no step again) and gives the results it would have."""
    out, _ = two_at_once
    cell = out / "grid" / CELLS[2]
    results, weights = _eval_results(cell), read_weights(cell / "model")
    shutil.rmtree(cell / "model")
    for name in ("eval_results.json", "eval_results.txt"):
        (cell / name).unlink()
    record = json.loads((out / "grid_results.json").read_text())
    record["cells"][2]["status"] = "pending"
    (out / "grid_results.json").write_text(json.dumps(record))
    others = {p: p.stat().st_mtime_ns for c in CELLS if c != CELLS[2] for p in (out / "grid" / c).rglob("*")}
    state = next(cell.glob("checkpoint-*")) / "training_state.pt"
    stamp = state.stat().st_mtime_ns
    assert _grid(model_files, data, out, "--grid_jobs=2") == 0
    assert {p: p.stat().st_mtime_ns for p in others} == others
    assert state.stat().st_mtime_ns == stamp
    assert _eval_results(cell) == results
    assert_same_weights(read_weights(cell / "model"), weights)
    assert "training already finished" in (cell / "log.txt").read_text()


@pytest.mark.slow  # a grid of its own, a process per run: 20-30 s
def test_one_cell_at_a_time_gives_the_results_of_two(two_at_once, model_files, data, tmp_path):
    """Two of the 2x2 grid's cells run one at a time (--grid_jobs=1, the default) equal the same cells run two at
    a time: the same scores and the same weights, bit for bit."""
    out, _ = two_at_once
    one = tmp_path / "one"
    argv = ["classify", *FLAGS, f"--data_dir={data}", *model_flags(model_files, one), *GRID[:2], "--num_train_epochs=1"]
    assert main(argv) == 0
    cells = [r["cell"] for r in json.loads((one / "grid_results.json").read_text())["cells"]]
    assert cells == [CELLS[0], CELLS[2]]
    for cell in cells:
        assert _eval_results(one / "grid" / cell) == _eval_results(out / "grid" / cell), cell
        assert_same_weights(read_weights(one / "grid" / cell / "model"), read_weights(out / "grid" / cell / "model"))


@pytest.mark.slow  # a grid of its own, a process per run: 20-30 s
def test_failed_cells_are_reported_and_the_rest_win(model_files, data, tmp_path, capsys):
    """A batch larger than the data gives no training step: that cell fails, the other wins (exit 0); when every
    cell fails the command does (exit 2)."""
    argv = ["classify", *FLAGS, f"--data_dir={data}", "--learning_rate=1e-3", "--num_train_epochs=1", "--grid_jobs=2"]
    out = tmp_path / "some"
    assert main([*argv, *model_flags(model_files, out), "--train_batch_size=8,64"]) == 0
    rows = {r["cell"]: r for r in json.loads((out / "grid_results.json").read_text())["cells"]}
    assert rows["bs=64,lr=0.001,ep=1"]["status"] == "failed"
    assert "gives 0 training steps" in rows["bs=64,lr=0.001,ep=1"]["error"]
    assert json.loads((out / "grid_results.json").read_text())["best"] == "bs=8,lr=0.001,ep=1"
    assert (out / "model" / "model.safetensors").is_file()
    assert "1 of 2 runs failed" in capsys.readouterr().err

    out = tmp_path / "none"
    assert main([*argv, *model_flags(model_files, out), "--train_batch_size=64,128"]) == 2
    err = capsys.readouterr().err
    assert "bert classify: error: every run of the grid failed" in err and "bs=128,lr=0.001,ep=1" in err
    assert json.loads((out / "grid_results.json").read_text())["best"] is None
    assert not (out / "model").exists()


@pytest.mark.slow  # a grid of its own, a process per run: 20-30 s
def test_a_squad_grid_ranks_its_runs_by_the_f1_of_their_predictions(model_files, tmp_path):
    """`bert squad` scores the dev set by predicting a file with answers (`--do_predict`): its grid ranks by f1 and
    exports the best run's predictions with its model."""
    from test_squad import squad_slice

    train = squad_slice("1.1", 0, 16, tmp_path / "train.json", training=True)
    predict = squad_slice("1.1", 16, 16, tmp_path / "predict.json", training=False)
    out = tmp_path / "out"
    flags = ["--do_train", "--do_predict", f"--train_file={train}", f"--predict_file={predict}", "--max_seq_length=128"]
    flags += ["--max_query_length=32", "--doc_stride=32", "--train_batch_size=8", "--num_train_epochs=1"]
    assert main(["squad", *flags, *model_flags(model_files, out), "--learning_rate=1e-3,1e-4", "--grid_jobs=2"]) == 0
    record = json.loads((out / "grid_results.json").read_text())
    assert record["metric"] == "f1" and [r["status"] for r in record["cells"]] == ["ok", "ok"]
    best = max(record["cells"], key=lambda r: r["f1"])
    assert record["best"] == best["cell"] and _eval_results(out)["f1"] == best["f1"]
    best_dir = out / "grid" / best["cell"]
    assert (out / "predictions.json").read_text() == (best_dir / "predictions.json").read_text()
    assert_same_weights(read_weights(out / "model"), read_weights(best_dir / "model"))


def test_a_train_embeddings_grid_ranks_its_runs_on_the_eval_file(model_files, tmp_path, capsys):
    """`bert train-embeddings` runs the release's grid as the fine-tuning commands do: a run per batch size, ranked
    by the retrieval score of the BEIR --eval_file (eval_ndcg@10 by default), the best exported and equal to that
    run alone; the grid's flags are checked for every run before the first starts."""
    from test_train_embeddings import TOPICS, beir_dir

    from bert.commands.train_embeddings import TrainEmbeddingsArgs, run_train_embeddings

    beir = beir_dir(tmp_path / "beir")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps([f"question on {t}", f"an answer about {t}"]) + "\n" for t in TOPICS))
    flags = [f"--train_file={pairs}", f"--eval_file={beir}", "--do_train", "--do_eval", "--learning_rate=1e-3"]
    out = tmp_path / "grid"
    grid = ["--train_batch_size=2,5", "--grid_jobs=2"]  # the cells side by side: half the test's time
    assert main(["train-embeddings", *flags, *model_flags(model_files, out), *grid]) == 0
    record = json.loads((out / "grid_results.json").read_text())
    assert record["command"] == "train-embeddings" and record["metric"] == "eval_ndcg@10"
    rows = record["cells"]
    assert [(r["cell"], r["status"], r["global_step"]) for r in rows] == [
        ("bs=2,lr=0.001,ep=3", "ok", 15),  # 10 pairs: 5 batches of 2, 3 epochs
        ("bs=5,lr=0.001,ep=3", "ok", 6),
    ]
    best = max(rows, key=lambda r: r["eval_ndcg@10"])
    assert record["best"] == best["cell"] and _eval_results(out)["eval_ndcg@10"] == best["eval_ndcg@10"]
    assert_same_weights(read_weights(out / "model"), read_weights(out / "grid" / best["cell"] / "model"))
    alone = tmp_path / "alone"
    values = {k: best[k] for k in ("train_batch_size", "learning_rate", "num_train_epochs")}
    args = args_for(TrainEmbeddingsArgs, model_files, alone, train_file=str(pairs), eval_file=str(beir), **values)
    run_train_embeddings(dataclasses.replace(args, do_train=True, do_eval=True))
    assert _eval_results(alone) == _eval_results(out)
    assert_same_weights(read_weights(alone / "model"), read_weights(out / "model"))
    # A grid needs the evaluation that ranks it; a cell's bad flag stops the grid before any run.
    no_eval = [f"--train_file={pairs}", "--do_train", "--train_batch_size=2,5"]
    no_eval += model_flags(model_files, tmp_path / "a")
    assert "--do_eval=true" in cli_error(capsys, "train-embeddings", *no_eval)
    bad = [*flags, "--train_batch_size=2,5", "--gradient_accumulation_steps=2"]
    assert "must be 1" in cli_error(capsys, "train-embeddings", *bad, *model_flags(model_files, tmp_path / "b"))
    assert not (tmp_path / "b" / "grid").exists()


def test_a_train_reranker_grid_ranks_by_ndcg_and_keeps_its_micro_batches(model_files, tmp_path):
    """`bert train-reranker`'s grid: ranked by eval_ndcg@10 by default, and --gradient_accumulation_steps, which the
    reranker's loss allows (the embedding losses do not), reaches every cell."""
    from test_train_embeddings import beir_dir

    beir = beir_dir(tmp_path / "beir")
    flags = [f"--train_file={beir}", f"--eval_file={beir}", f"--mine_negatives={model_files[2]}", "--num_negatives=2"]
    flags += ["--rerank_top_k=5", "--do_train", "--do_eval", "--num_train_epochs=1", "--train_batch_size=4"]
    flags += ["--gradient_accumulation_steps=2"]
    out = tmp_path / "grid"
    grid = ["--learning_rate=1e-3,1e-4", "--grid_jobs=2"]  # the cells side by side: half the test's time
    assert main(["train-reranker", *flags, *model_flags(model_files, out), *grid]) == 0
    record = json.loads((out / "grid_results.json").read_text())
    assert record["command"] == "train-reranker" and record["metric"] == "eval_ndcg@10"
    assert [r["status"] for r in record["cells"]] == ["ok", "ok"]
    best = max(record["cells"], key=lambda r: r["eval_ndcg@10"])
    assert record["best"] == best["cell"] and _eval_results(out)["eval_ndcg@10"] == best["eval_ndcg@10"]
    for row in record["cells"]:
        assert (
            json.loads((out / "grid" / row["cell"] / "args.json").read_text())["args"]["gradient_accumulation_steps"]
            == 2
        )
