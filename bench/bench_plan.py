"""`bert pretrain --plan` checked and applied: the predicted CPU peak memory against the measured one for 3
shapes, and the predictions for BERT-Base and BERT-Large on 1 and 8 H100s (and on A100s, next to NVIDIA's
published A100 throughput, which gives the MFU that figure implies).

The measured peak is `bert.plan.measure_cpu_peak` in a fresh process per shape (glibc's mmap threshold
fixed, so that freed tensors leave the resident set). Published figures: NVIDIA DeepLearningExamples,
PaddlePaddle/LanguageModeling/BERT README, table "Pre-training NVIDIA DGX A100 (8x A100 80GB)": BERT-Large,
sequence length 128, mixed precision, 694 sequences/s on 1 GPU and 5541 on 8.

    python bench/bench_plan.py [--skip_measure]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

from bert.config import BertConfig, named_config
from bert.plan import Shape, make_plan

MEMORY_SHAPES = [
    (dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024, vocab_size=30522),
     Shape(8, 128, 20)),
    (dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8, intermediate_size=2048, vocab_size=8000),
     Shape(4, 256, 40)),
    (dict(num_hidden_layers=6, hidden_size=128, num_attention_heads=2, intermediate_size=512, vocab_size=30522),
     Shape(32, 64, 10)),
]  # fmt: skip
MEASURE = """
import json, sys
from bert.config import BertConfig
from bert.plan import Shape, measure_cpu_peak
fields, shape = json.loads(sys.argv[1])
print(measure_cpu_peak(BertConfig(max_position_embeddings=512, **fields), Shape(*shape)))
"""
# (model, devices, published sequences/s) from the README named in the module docstring.
PUBLISHED = {("large", "1xA100"): 694.0, ("large", "8xA100"): 5541.0}


def measure() -> None:
    print(
        "| shape (L/H/A/I/V, batch x seq, predictions) | predicted peak MiB | measured peak MiB | predicted/measured |"
    )
    print("|---|---:|---:|---:|")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    for fields, shape in MEMORY_SHAPES:
        arg = json.dumps([fields, [shape.batch, shape.seq, shape.predictions]])
        done = subprocess.run([sys.executable, "-c", MEASURE, arg], env=env, capture_output=True, text=True, check=True)
        measured = int(done.stdout.split()[-1])
        plan = make_plan(BertConfig(max_position_embeddings=512, **fields), train_batch_size=shape.batch,
                         max_seq_length=shape.seq, max_predictions_per_seq=shape.predictions)  # fmt: skip
        predicted = plan["memory_per_device"]["no_checkpointing"]["peak"]
        name = "/".join(str(fields[k]) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                 "intermediate_size", "vocab_size"))  # fmt: skip
        print(f"| {name}, {shape.batch} x {shape.seq}, {shape.predictions} | {predicted / 2**20:.1f} | "
              f"{measured / 2**20:.1f} | {predicted / measured:.3f} |")  # fmt: skip


def predictions(mfu: float) -> None:
    print(f"\n| model | devices | global batch | peak GiB/device (no ckpt / ckpt) | TFLOPs/step | predicted seq/s at "
          f"{mfu:.0%} MFU | NVIDIA published seq/s | MFU the published figure implies |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model in ("base", "large"):
        config = named_config(model, vocab_size=30522)
        for devices in ("1xH100", "8xH100", "1xA100", "8xA100"):
            n = int(devices.split("x")[0])
            batch = 64 * n  # 64 sequences per device and step, as NVIDIA's phase-1 micro-batches
            plan = make_plan(config, train_batch_size=batch, max_seq_length=128, max_predictions_per_seq=20,
                             devices=devices, precision="bf16", mfu=mfu)  # fmt: skip
            mem = plan["memory_per_device"]
            flops = plan["flops_per_step"]["no_checkpointing"]
            predicted = plan["sequences_per_second"]["no_checkpointing"]
            published = PUBLISHED.get((model, devices))
            implied = (
                "" if published is None else f"{published * flops / batch / (n * plan['peak_flops_per_device']):.1%}"
            )
            peaks = (
                f"{mem['no_checkpointing']['peak'] / 2**30:.2f} / {mem['gradient_checkpointing']['peak'] / 2**30:.2f}"
            )
            shown = "" if published is None else f"{published:,.0f}"
            cells = f"{peaks} | {flops / 1e12:.2f} | {predicted:,.0f}"
            print(f"| BERT-{model.capitalize()} | {devices} | {batch} | {cells} | "
                  f"{shown} | {implied} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip_measure", action="store_true", help="Only the device predictions.")
    parser.add_argument("--mfu", type=float, default=0.4)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    if not args.skip_measure:
        measure()
    predictions(args.mfu)


if __name__ == "__main__":
    main()
