"""BERT-Small (L-4_H-512) pre-trained on the shared books within a time budget on one device, through the
commands a user runs: `bert create-pretraining-data --streaming` and `bert pretrain`.

    python bench/gpu_small_pretrain.py --corpus corpus.txt.gz --heldout heldout.txt.gz --vocab vocab.txt \
        --out DIR --seconds 180

1. create-pretraining-data (streaming, native shards, `--num_workers`) on the training corpus and, with another
   seed and dupe factor 1, on the held-out book (`--data_only` stops there; a later run then skips it);
2. a calibration run of `--calibration_steps` steps gives the sequences per second (the last logged interval);
3. the run itself, `--num_train_steps` chosen so that it fits `--seconds` at that rate, with warm-up over 10% of
   it, the held-out data evaluated at its end, and its model exported to DIR/pretrain/model.
The shapes are the original's phase-1 recipe (seq 128, 20 masked positions, batch `--train_batch_size`), bf16.
`--quick` runs a tiny model for a few steps (the CPU smoke test). DIR/summary.json says what ran and how fast.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def bert(*args: str, log: Path) -> float:
    """Run `python -m bert ARGS`, its output appended to `log`; returns its wall seconds."""
    start = time.perf_counter()
    with log.open("a", encoding="utf-8") as f:
        f.write(f"\n$ bert {' '.join(args)}\n")
        f.flush()
        subprocess.run([sys.executable, "-m", "bert", *args], check=True, stdout=f, stderr=subprocess.STDOUT)
    return time.perf_counter() - start


def last_rate(metrics: Path) -> float:
    """The sequences per second of the last logged interval of a run's metrics.jsonl."""
    rates = [
        json.loads(line)["sequences_per_second"]
        for line in metrics.read_text(encoding="utf-8").splitlines()
        if '"sequences_per_second"' in line
    ]
    if not rates:
        raise RuntimeError(f"{metrics} logged no sequences_per_second")
    return float(rates[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--vocab", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=180, help="the training run's time budget")
    parser.add_argument("--config", default="small")
    parser.add_argument("--train_batch_size", type=int, default=256)
    parser.add_argument("--learning_rate", default="5e-4")
    parser.add_argument("--calibration_steps", type=int, default=100)
    parser.add_argument("--num_workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data_only", action="store_true", help="make the data and stop")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    if args.quick:
        args.config, args.train_batch_size, args.calibration_steps, args.precision = "tiny", 8, 6, "fp32"
    data = ["--vocab_file", args.vocab, "--max_seq_length=128", "--max_predictions_per_seq=20", "--streaming=true"]
    summary: dict[str, object] = {"command": "python bench/gpu_small_pretrain.py " + " ".join(sys.argv[1:])}
    if not (out / "eval_data").is_dir():  # made already by a --data_only run (beside other work)
        summary["create_train_s"] = bert(
            "create-pretraining-data",
            f"--input_file={args.corpus}",
            f"--output_file={out / 'train_data'}",
            "--dupe_factor=1" if args.quick else "--dupe_factor=5",
            f"--num_workers={args.num_workers}",
            *data,
            log=log,
        )
        summary["create_eval_s"] = bert(
            "create-pretraining-data",
            f"--input_file={args.heldout}",
            f"--output_file={out / 'eval_data'}",
            "--dupe_factor=1",
            "--random_seed=7",
            *data,
            log=log,
        )
    if args.data_only:
        return
    common = [
        f"--bert_config_file={args.config}",
        f"--vocab_file={args.vocab}",
        f"--input_file={out / 'train_data'}",
        f"--train_batch_size={args.train_batch_size}",
        "--max_seq_length=128",
        "--max_predictions_per_seq=20",
        f"--precision={args.precision}",
        f"--learning_rate={args.learning_rate}",
        "--do_train=true",
    ]
    calibration = out / "calibration"
    summary["calibration_s"] = bert(
        "pretrain",
        *common,
        f"--output_dir={calibration}",
        f"--num_train_steps={args.calibration_steps}",
        f"--num_warmup_steps={args.calibration_steps // 10}",
        f"--log_every={max(1, args.calibration_steps // 3)}",
        log=log,
    )
    rate = last_rate(calibration / "metrics.jsonl")
    steps = max(10, int(args.seconds * rate / args.train_batch_size))
    summary.update(calibration_seq_per_s=rate, num_train_steps=steps)
    print(f"calibration: {rate:.0f} sequences/s -> {steps} steps for {args.seconds:.0f} s", flush=True)
    summary["pretrain_s"] = bert(
        "pretrain",
        *common,
        f"--output_dir={out / 'pretrain'}",
        f"--num_train_steps={steps}",
        f"--num_warmup_steps={steps // 10}",
        f"--eval_files={out / 'eval_data'}",
        "--do_eval=true",
        "--max_eval_steps=50",
        "--save_checkpoints_minutes=1",
        f"--log_every={max(1, steps // 100)}",
        log=log,
    )
    results = out / "pretrain" / "eval_results.json"
    summary["eval_results"] = json.loads(results.read_text(encoding="utf-8")) if results.is_file() else None
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
