"""Dev scores of a pre-trained model next to the same shape from random initialisation.

    python bench/finetune_table.py PRETRAINED_MODEL_DIR [--out bench/out/finetune_table] [--tasks ...]
        [--seeds 12345,1,2] [--label NAME]

Runs the real commands (`bert classify`, `bert ner`, `bert squad`) on the shared data, once from the
pre-trained weights and once from random initialisation (the pre-trained model's config.json), for each
fine-tuning seed, and prints a markdown table of the means (with the spread over seeds when there are
several). Runs are kept under OUT/LABEL/TASK/seedN and OUT/random/TASK/seedN and reused when present, so
several pre-trained models share the random-init runs. SQuAD 1.1 has no training set here: the model is
fine-tuned on the first 1,500 questions of the dev set and evaluated on the last 1,000 (different
articles), and is labelled as such.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
COMMON = [
    "--do_train=true",
    "--do_eval=true",
    "--max_seq_length=128",
    "--train_batch_size=32",
    "--eval_batch_size=64",
    "--learning_rate=1e-4",
    "--num_train_epochs=3",
]
# (name, command, flags, metrics to report)
TASKS = {
    "MRPC": ("classify", ["--task_name=MRPC", f"--data_dir={SHARED / 'glue/MRPC'}"], ["eval_accuracy", "eval_f1"]),
    "SST-2": (
        "classify",
        ["--task_name=SST-2", f"--data_dir={SHARED / 'glue/SST-2'}", "--num_train_epochs=0.3"],
        ["eval_accuracy"],
    ),
    "CoLA": ("classify", ["--task_name=CoLA", f"--data_dir={SHARED / 'glue/CoLA'}"], ["eval_mcc"]),
    "STS-B": (
        "classify",
        ["--task_name=STS-B", f"--data_dir={SHARED / 'glue/STS-B'}"],
        ["eval_pearson", "eval_spearman"],
    ),
    "RTE": ("classify", ["--task_name=RTE", f"--data_dir={SHARED / 'glue/RTE'}"], ["eval_accuracy"]),
    "CoNLL-2003": ("ner", [f"--data_dir={SHARED / 'conll2003'}"], ["eval_f1"]),
    "SQuAD 1.1 (dev split)": ("squad", [], ["exact_match", "f1"]),
}


def squad_split(out: Path) -> tuple[Path, Path]:
    """The first articles of dev v1.1 up to 1,500 questions to train on, the last ones up to 1,000 to test on."""
    articles = json.load(gzip.open(SHARED / "squad" / "dev-v1.1.json.gz", "rt", encoding="utf-8"))["data"]

    def take(items: list, limit: int) -> list:
        picked, n = [], 0
        for article in items:
            if n >= limit:
                break
            picked.append(article)
            n += sum(len(p["qas"]) for p in article["paragraphs"])
        return picked

    train, test = take(articles, 1500), take(articles[::-1], 1000)[::-1]
    for article in train:  # run_squad trains on exactly one answer per question: keep the first
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa["answers"] = qa["answers"][:1]
    paths = out / "squad_train.json", out / "squad_test.json"
    for path, part in zip(paths, (train, test)):
        path.write_text(json.dumps({"data": part, "version": "1.1"}))
    return paths


def run(name: str, label: str | None, model_dir: Path, out: Path, seed: int) -> dict[str, float]:
    """One fine-tuning run: from `model_dir`'s weights under `label`, or from random init if `label` is None."""
    command, flags, _ = TASKS[name]
    target = out / (label or "random") / name.split()[0] / f"seed{seed}"
    results = target / "eval_results.json"
    if not results.exists():
        init_flags = (
            [f"--init_checkpoint={model_dir}"]
            if label
            else [f"--bert_config_file={model_dir / 'config.json'}", f"--vocab_file={model_dir / 'vocab.txt'}"]
        )
        if command == "squad":
            train, test = squad_split(out)
            args = [
                "--do_train=true",
                "--do_predict=true",
                f"--train_file={train}",
                f"--predict_file={test}",
                "--max_seq_length=256",
                "--doc_stride=128",
                "--max_query_length=48",
                "--train_batch_size=32",
                "--learning_rate=1e-4",
                "--num_train_epochs=2",
            ]
        else:
            args = COMMON + flags
        cmd = [sys.executable, "-m", "bert", command, f"--output_dir={target}", f"--seed={seed}", *init_flags, *args]
        subprocess.run(cmd, check=True, capture_output=True)
    return json.loads(results.read_text())


def summary(values: list[float]) -> str:
    mean = float(np.mean(values))
    return f"{mean:.4f}" if len(values) == 1 else f"{mean:.4f} ± {float(np.std(values)):.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model_dir")
    parser.add_argument("--out", default="bench/out/finetune_table")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", default="12345", help="fine-tuning seeds, comma-separated")
    parser.add_argument("--label", help="name of the pre-trained model's runs (default: its parent folder's name)")
    opts = parser.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(opts.model_dir)
    label = opts.label or model_dir.resolve().parent.name
    seeds = [int(s) for s in opts.seeds.split(",")]
    rows = [
        f"| task | metric | pre-trained ({label}) | random init | difference | seeds |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in opts.tasks.split(","):
        try:
            res = {init: [run(name, init, model_dir, out, seed) for seed in seeds] for init in (label, None)}
        except subprocess.CalledProcessError as e:
            print(f"{name}: failed: {e.stderr.decode()[-500:]}", file=sys.stderr)
            continue
        for metric in TASKS[name][2]:
            a = [float(r[metric]) for r in res[label]]
            b = [float(r[metric]) for r in res[None]]
            diff = float(np.mean(a) - np.mean(b))
            rows.append(f"| {name} | {metric} | {summary(a)} | {summary(b)} | {diff:+.4f} | {len(seeds)} |")
        print("\n".join(rows), flush=True)
    (out / f"table_{label}.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
