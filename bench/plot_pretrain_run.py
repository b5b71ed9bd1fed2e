"""Curves and a summary of a pre-training run made by bench/pretrain_real_run.sh.

    python bench/plot_pretrain_run.py [OUT_DIR]

Evaluates every kept checkpoint of both phases (and the random initialisation, step 0) on the held-out
data with the real `bert pretrain --do_eval`, computes the unigram baseline of masked-LM accuracy on the same data
(always predicting its most frequent masked token), and writes bench/pretrain_real_run.png and
bench/pretrain_real_run.json.
"""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent


def eval_checkpoint(out: Path, step: int, checkpoint: Path | None) -> dict[str, float]:
    target = out / f"eval_step_{step}"
    results = target / "eval_results.txt"
    if not results.exists():
        vocab = BENCH.parents[1] / "shared" / "data" / "vocab" / "uncased.txt"
        cmd = [
            sys.executable,
            "-m",
            "bert",
            "pretrain",
            "--do_eval=true",
            f"--input_file={out / 'eval_data'}",
            f"--output_dir={target}",
            "--bert_config_file=mini",
            f"--vocab_file={vocab}",
            "--eval_batch_size=32",
            "--max_eval_steps=50",
            "--max_seq_length=128",
            "--max_predictions_per_seq=20",
        ]
        if checkpoint is not None:
            cmd.append(f"--init_checkpoint={checkpoint}")
        subprocess.run(cmd, check=True, capture_output=True)
    return {k.strip(): float(v) for k, v in (line.split("=") for line in results.read_text().splitlines())}


def unigram_baseline(data_dir: Path) -> tuple[float, int]:
    from bert.formats.native import open_native_dataset

    _, records = open_native_dataset(data_dir)
    counts: Counter = Counter()
    for start in range(0, len(records), 4096):
        batch = records.get_batch(np.arange(start, min(start + 4096, len(records))))
        ids, weights = batch["masked_lm_ids"].reshape(-1), batch["masked_lm_weights"].reshape(-1)
        counts.update(ids[weights > 0].tolist())
    token, n = counts.most_common(1)[0]
    return n / sum(counts.values()), token


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(sys.argv[1] if len(sys.argv) > 1 else BENCH / "out" / "real_run")
    # Phase 2 (pretrain2, if run) continues from phase 1's last step: its steps are counted on from there.
    metrics, evals, offset = [], {0: eval_checkpoint(out, 0, None)}, 0
    for phase in ("pretrain", "pretrain2"):
        if not (out / phase / "metrics.jsonl").exists():
            break
        lines = [json.loads(line) for line in (out / phase / "metrics.jsonl").read_text().splitlines()]
        metrics += [{**m, "step": m["step"] + offset, "phase": phase} for m in lines]
        for ckpt in sorted((out / phase).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
            step = int(ckpt.name.split("-")[1]) + offset
            evals[step] = eval_checkpoint(out, step, ckpt)
        offset = metrics[-1]["step"]
    baseline, token = unigram_baseline(out / "eval_data")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([m["step"] for m in metrics], [m["loss"] for m in metrics], label="training loss (MLM + NSP)")
    ax1.plot([m["step"] for m in metrics], [m["masked_lm_loss"] for m in metrics], label="training MLM loss")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.legend()
    steps = sorted(evals)
    ax2.plot(steps, [evals[s]["masked_lm_accuracy"] for s in steps], "o-", label="held-out masked-LM accuracy")
    ax2.axhline(baseline, color="grey", linestyle="--", label=f"unigram baseline ({baseline:.3f})")
    ax2.set_xlabel("step")
    ax2.set_ylabel("accuracy")
    ax2.legend()
    fig.suptitle("BERT-Mini (L-4_H-256) pre-trained on the shared corpus, CPU")
    fig.tight_layout()
    fig.savefig(BENCH / "pretrain_real_run.png", dpi=100)
    summary = {
        "unigram_baseline_accuracy": baseline,
        "unigram_baseline_token_id": token,
        "held_out_eval": {str(s): evals[s] for s in steps},
        "training_metrics": metrics,
    }
    (BENCH / "pretrain_real_run.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({"unigram": baseline, "eval": {s: evals[s]["masked_lm_accuracy"] for s in steps}}))


if __name__ == "__main__":
    main()
