"""The "Make a small model" figure and table: quality against speed of each teacher and its students, from the
numbers `bench/bench_distill.py --json` saved.

    python bench/plot_small_models.py bench/distill_mrpc.json bench/distill_sst2.json bench/distill_b.json \
        bench/distill_mrpc_stsb.json bench/distill_sst2_16k.json bench/distill_b_long.json \
        bench/distill_b_045.json bench/distill_mrpc_grid.json bench/distill_b_3seeds.json bench/distill_b_bs16.json \
        bench/distill_b_bs8.json

A file with "seeds" (a run per seed with a larger transfer set: its "task" and "transfer") adds its distilled
student as a row of that task's panel, at the student's speed of the task's main file (the same model shape,
measured there on a quiet machine); a (b) file with "transfer" (a longer run) adds its student to (b)'s panel,
at the first run's student speed, or where it has "own_speed" (another student shape or length) at the first
run's teacher speed times its own student/teacher ratio. A grid file (a `cell_*` entry: the rows of one grid cell
run on paired teachers and students) adds that cell's rows to its task's panel. A (b) file scored on every test query
(`first_mrr@10` beside `mrr@10`) is a panel of its own, at the embed speeds measured in its run; one such file
with "transfer" (another setting of the same student) adds its students to that panel.

Writes bench/small_models.png (one panel per task: the dev metric or MRR@10 against `bert predict` /
`bert embed` sequences per second; each student's mark is the mean of its seeds, its bar their spread) and
prints the Markdown table the README shows.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def points(results: dict) -> dict[str, list[tuple[str, list[float], float]]]:
    """Per panel: (model, its seeds' scores, its sequences per second)."""
    panels: dict[str, list[tuple[str, list[float], float]]] = {}
    for task, r in results.get("a", {}).items():
        if task == "seconds":
            continue
        speed = r["predict_seq_per_s"]
        rows = []
        for label, values in r["rows"].items():
            if label.startswith("compact"):
                continue  # BERT-Small's speed was not measured beside them
            rows.append((label, values, speed["teacher" if label.startswith("teacher") else "student"]))
        panels[f"{task} dev {r['metric'].removeprefix('eval_')} / bert predict"] = rows
    b = results.get("b")
    if b:
        panels["squad-dev test MRR@10 / bert embed"] = embedder_rows(b, "3 layers") + [
            (
                f"3 layers, distilled (MSE), {label}",
                values,
                b["embed_teacher_s"] * ratio if ratio else b["embed_student_s"],
            )
            for label, values, ratio in b.get("longer", [])
        ]
    every = results.get("b_every")
    if every:
        panels["squad-dev test MRR@10, all queries / bert embed (two threads)"] = (
            embedder_rows(every, "layers 0,4,5")
            + [
                (
                    "layers 0,4,5, sentence-transformers' MSELoss",
                    [v["mrr@10"] for v in every["theirs"]],
                    every["embed_student_s"],
                )
            ]
            + [
                (f"layers 0,4,5, distilled (MSE), {label}", values, every["embed_student_s"])
                for label, values in every.get("more", [])
            ]
        )
    return panels


def embedder_rows(b: dict, student: str) -> list[tuple[str, list[float], float]]:
    """A (b) run's teacher, undistilled student and our distilled students (MRR@10), at its embed speeds."""
    mrr = "mrr@10"
    return [
        ("teacher (6 layers)", [b["teacher"][mrr]], b["embed_teacher_s"]),
        (f"{student}, undistilled", [b["student_undistilled"][mrr]], b["embed_student_s"]),
        (f"{student}, distilled (MSE)", [v[mrr] for v in b["ours"]], b["embed_student_s"]),
    ]


def table(panels: dict[str, list[tuple[str, list[float], float]]]) -> str:
    lines = ["| task / speed | model | score (seeds) | sequences/s |", "|---|---|---:|---:|"]
    for panel, rows in panels.items():
        for label, values, speed in rows:
            mean = statistics.fmean(values)
            spread = f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""
            lines.append(f"| {panel} | {label} | {mean:.4f}{spread} ({len(values)}) | {speed:.1f} |")
    return "\n".join(lines)


def plot(panels: dict[str, list[tuple[str, list[float], float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 2
    lines = -(-len(panels) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(6.5 * columns, 4.5 * lines), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (panel, rows) in zip(axes.flat, panels.items()):
        for label, values, speed in rows:
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            ax.errorbar(speed, statistics.fmean(values), yerr=spread, fmt="o", capsize=3, label=label)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("sequences per second" if "threads)" in panel else "sequences per second (one CPU thread)")
        ax.set_xlim(left=0)
        ax.margins(y=0.15)
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def transfer_rows(run: dict) -> dict[str, list[float]]:
    """A per-seed run's distilled student as one row: its label names the transfer set, its values the seeds'."""
    label = f"3 layers, distilled, {run['transfer']}"
    return {label: [seed["rows"]["3 layers, distilled"][0] for seed in run["seeds"].values()]}


def grid_rows(run: dict) -> dict[str, list[float]]:
    """A grid file's cell run on paired teachers: its rows, labelled with the cell (the teachers kept their own
    setting: one per seed)."""
    (cell,) = (k for k in run if k.startswith("cell_"))
    name = cell.removeprefix("cell_").replace("_", " ")
    return {
        f"{label}, one per seed" if label.startswith("teacher") else f"{label}, paired teachers, grid cell {name}": v
        for label, v in run[cell].items()
    }


def every_query(run: dict) -> bool:
    """Whether a (b) file scored every test query (its `mrr@10`), the first ones apart (`first_mrr@10`)."""
    return "first_mrr@10" in run.get("b", {}).get("teacher", {})


def main() -> None:
    results: dict = {}
    extra = []
    for path in sys.argv[1:]:  # parts and (a)'s tasks from several runs of the bench, merged
        loaded = json.loads(Path(path).read_text(encoding="utf-8"))
        if every_query(loaded) and "transfer" not in loaded:
            results["b_every"] = loaded["b"]
            continue
        if "seeds" in loaded or "transfer" in loaded or any(k.startswith("cell_") for k in loaded):
            extra.append(loaded)
            continue
        for part, values in loaded.items():
            results.setdefault(part, {}).update(values)
    for run in extra:
        if every_query(run):  # another setting of the same student
            values = [v["mrr@10"] for v in run["b"]["ours"]]
            results["b_every"].setdefault("more", []).append((run["transfer"], values))
        elif "b" in run:  # a longer (b) run: its student beside the first; its speed, where it measured its own,
            # as its ratio to the teacher measured beside it (times the first run's teacher speed: one axis)
            b = run["b"]
            ratio = b["embed_student_s"] / b["embed_teacher_s"] if run.get("own_speed") else None
            results["b"].setdefault("longer", []).append((run["transfer"], [v["mrr@10"] for v in b["ours"]], ratio))
        elif "seeds" in run:
            results["a"][run["task"]]["rows"].update(transfer_rows(run))
        else:
            results["a"][run["task"]]["rows"].update(grid_rows(run))
    panels = points(results)
    out = BENCH / "small_models.png"
    plot(panels, out)
    print(table(panels))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
