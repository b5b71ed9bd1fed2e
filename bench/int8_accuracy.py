"""What int8 costs a fine-tuned classifier: GLUE dev accuracy and speed, fp32 vs int8, ours vs ONNX Runtime.

For each model directory given (a `bert classify` output's `model/`, e.g. those bench/accuracy_table.py
trains), on the task's dev set (the same features for every engine, `Predictor.classify`):
- ours fp32 and ours int8 (`Predictor.from_pretrained(..., quantize="int8")`, `bert.quantization`);
- ONNX Runtime fp32 and int8: `bert export --optimize` and `bert export --optimize --quantize=int8`
  (ONNX Runtime's BERT optimizer, then its dynamic quantizer), run by `Predictor(..., backend="onnx")`.
Accuracy (and F1 for MRPC) of each, and the sequences per second of one pass over the dev set (rows
interleaved, best of `--repeats`; the same length-sorted batches inside the Predictor for every engine).

    python bench/int8_accuracy.py --task MRPC MODEL_DIR [MODEL_DIR ...] [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bert.inference import Predictor
from bert.metrics import glue_metrics
from bert.tasks.classification import TASKS as PROCESSORS

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def export(model: Path, out: Path, quantize: str) -> Path:
    cmd = [sys.executable, "-m", "bert", "export", f"--model={model}", f"--output={out}/", "--optimize"]
    subprocess.run([*cmd, f"--quantize={quantize}"], check=True, capture_output=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--task", default="MRPC")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    processor = PROCESSORS[opts.task.lower()]()
    dev = processor.get_dev_examples(SHARED / "glue" / opts.task)
    labels = processor.get_labels()
    pairs = [(ex.text_a, ex.text_b) for ex in dev]
    gold = np.array([labels.index(ex.label) for ex in dev])
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, {opts.task} dev ({len(pairs)} examples), {opts.threads} threads, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n, model in enumerate(map(Path, opts.models)):
            engines = {
                "ours fp32": Predictor.from_pretrained(model, device="cpu"),
                "ours int8": Predictor.from_pretrained(model, quantize="int8"),
                "ONNX Runtime optimized fp32": Predictor.from_pretrained(
                    export(model, Path(tmp, f"{n}_fp32"), "none"), backend="onnx"
                ),
                "ONNX Runtime optimized int8": Predictor.from_pretrained(
                    export(model, Path(tmp, f"{n}_int8"), "int8"), backend="onnx"
                ),
            }
            best = {name: float("inf") for name in engines}
            predictions = {}
            for _ in range(opts.repeats):
                for name, predictor in engines.items():  # interleaved: a load change hits every row alike
                    start = time.perf_counter()
                    out = predictor.classify(pairs, batch_size=32)
                    best[name] = min(best[name], time.perf_counter() - start)
                    predictions[name] = np.array([labels.index(r["label"]) for r in out])
            for name in engines:
                scores = glue_metrics(opts.task, predictions[name], gold)
                scores["seq_per_s"] = len(pairs) / best[name]
                scores["agree_fp32"] = float((predictions[name] == predictions["ours fp32"]).mean())
                rows.setdefault(name, []).append(scores)
                print(f"{model}: {name}: {scores}", flush=True)
    keys = [k for k in rows["ours fp32"][0] if k != "agree_fp32"] + ["agree_fp32"]
    print("\n| engine | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys))
    for name, values in rows.items():
        cells = [
            f"{np.mean([v[k] for v in values]):.4f}" if k != "seq_per_s" else f"{np.mean([v[k] for v in values]):.1f}"
            for k in keys
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
