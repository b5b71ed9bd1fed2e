"""Training curves: what `bert.plotting` draws is what metrics.jsonl and eval_results.json hold, for one run
or several on the same axes; without matplotlib a training run only gets one line saying how to get plots."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from bert import plotting
from bert.cli import main
from bert.errors import InputError
from conftest import check_curves, cli_error, png_size

matplotlib = pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")


def fake_run(directory: Path, steps: int = 10, seed: int = 0, every: int = 5, pretrain: bool = False) -> Path:
    """A run directory as a training command leaves it: training lines every step, evaluation lines every
    `every` steps (fine-tuning with --eval_every_steps), and the final evaluation in eval_results.json."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    lines = []
    for step in range(1, steps + 1):
        lines.append({"step": step, "loss": float(3 / step + rng.random()), "learning_rate": 1e-4 * (1 - step / steps)})
        lines[-1].update(grad_norm=float(rng.random()), sequences_per_second=100.0)
        if every and step % every == 0 and not pretrain:
            lines.append({"step": step, "eval_accuracy": float(rng.random()), "eval_loss": float(rng.random())})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if pretrain:  # run_pretraining.py's keys, without the eval_ prefix
        final = {"global_step": steps, "loss": 2.5, "masked_lm_accuracy": 0.4, "next_sentence_accuracy": 0.7}
    else:  # the Estimator's `loss` beside eval_loss
        final = {"global_step": steps, "eval_accuracy": 0.75, "eval_loss": 0.5, "loss": 0.51}
    (directory / "eval_results.json").write_text(json.dumps(final))
    return directory


def _pixels_of(png: Path, color: str) -> int:
    """How many pixels of the picture have `color` (a matplotlib color name), within rounding."""
    image = matplotlib.image.imread(png)[..., :3]
    rgb = np.array(matplotlib.colors.to_rgb(color))
    return int((np.abs(image - rgb).max(-1) < 0.02).sum())


def test_one_run_draws_the_files_series(tmp_path):
    run = fake_run(tmp_path / "run")
    record = plotting.plot_runs([run], run / "curves.png")
    check_curves(run)
    drawn = record["runs"][0]
    # the final evaluation (step 10) was also logged during training: it is drawn once, with its logged value
    assert drawn["eval"]["eval_accuracy"]["steps"] == [5, 10]
    assert set(drawn["eval"]) == {"eval_accuracy", "eval_loss"}  # the Estimator's `loss` is not a curve
    assert _pixels_of(run / "curves.png", "C0") > 500  # the lines are there, in the first run's colour
    assert _pixels_of(run / "curves.png", "C1") == 0


def test_pretraining_results_get_the_eval_prefix_at_their_step(tmp_path):
    run = fake_run(tmp_path / "run", steps=8, pretrain=True)
    record = plotting.plot_runs([run], run / "curves.png")
    evals = record["runs"][0]["eval"]
    assert evals["eval_masked_lm_accuracy"] == {"steps": [8], "values": [0.4]}
    assert evals["eval_loss"] == {"steps": [8], "values": [2.5]}
    check_curves(run)


def test_two_runs_on_the_same_axes(tmp_path, capsys):
    a, b = fake_run(tmp_path / "a" / "classify"), fake_run(tmp_path / "b" / "classify", seed=1, every=2)
    out = tmp_path / "both.png"
    assert main(["plot", str(a), str(b), f"--output_file={out}", "--names=pre-trained,random init"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert png_size(out) == (1500, 450)
    record = json.loads(out.with_suffix(".json").read_text())
    assert [r["label"] for r in record["runs"]] == ["pre-trained", "random init"]
    for run, drawn in zip((a, b), record["runs"]):
        lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
        assert drawn["train"]["loss"]["values"] == [m["loss"] for m in lines if "learning_rate" in m]
    assert record["runs"][1]["eval"]["eval_accuracy"]["steps"] == [2, 4, 6, 8, 10]
    assert _pixels_of(out, "C0") > 500 and _pixels_of(out, "C1") > 500
    # Same directory names: the legend uses the paths instead.
    assert main(["plot", str(a), str(b), f"--output_file={out}"]) == 0
    assert [r["label"] for r in json.loads(out.with_suffix(".json").read_text())["runs"]] == [str(a), str(b)]


def test_bad_runs_and_flags_are_one_line_errors(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    assert "no metrics.jsonl" in cli_error(capsys, "plot", str(tmp_path / "nowhere"))
    assert "2 names for 1 runs" in cli_error(capsys, "plot", str(run), "--names=a,b")
    assert "ending in .png" in cli_error(capsys, "plot", str(run), "--output_file=curves.pdf")
    n = len((run / "metrics.jsonl").read_text().splitlines())
    with open(run / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    assert f"{run / 'metrics.jsonl'}:{n + 1}: not a metrics line" in cli_error(capsys, "plot", str(run))
    assert not (run / "curves.png").exists()


def test_without_matplotlib_one_line_and_nothing_else(tmp_path, monkeypatch, caplog):
    run = fake_run(tmp_path / "run")
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setattr(plotting, "_missing_matplotlib_reported", False)
    with pytest.raises(InputError, match=r"pip install 'bert\[plot\]'"):
        plotting.plot_runs([run], run / "curves.png")
    with caplog.at_level(logging.INFO, logger="bert.plotting"):
        assert plotting.try_plot([run], run / "curves.png") is None
        assert plotting.try_plot([run], run / "curves.png") is None  # a second run in the same process
    assert [r.getMessage() for r in caplog.records] == [
        "no curves.png: pip install 'bert[plot]' to get training curves as pictures"
    ]
    assert sorted(p.name for p in run.iterdir()) == ["eval_results.json", "metrics.jsonl"]


def test_a_failing_plot_never_fails_the_run(tmp_path, monkeypatch, caplog):
    run = fake_run(tmp_path / "run")

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(plotting, "plot_runs", broken)
    with caplog.at_level(logging.WARNING, logger="bert.plotting"):
        assert plotting.try_plot([run], run / "curves.png") is None
    assert "could not draw" in caplog.text and "disk full" in caplog.text
