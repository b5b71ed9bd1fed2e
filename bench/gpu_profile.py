"""Where a BERT-Base pre-training step's time goes on a GPU: a torch.profiler trace of eager and compiled steps.

The first GPU run (bench/RESULTS.md, "On a GPU") measured 30% MFU eager and 40% compiled on an H200 for BERT-Base
at 256 x 128 in bf16 without saying why: compilation gaining a third says a third of the eager step is not matrix
work, or that the GPU waits on the host. This traces `--steps` steps of each, after warm-up (the compiled model
compiles in its warm-up), the same step as `bench/gpu.py`'s pre-training rows (forward, backward, clipping at
1.0, the original's AdamWeightDecay; bf16 autocast; the MLM head at the masked positions only), and reports:

- the wall time of the traced steps and the GPU's busy time within it (the union of kernel and copy intervals):
  busy far below the wall time means the host's launches set the pace;
- kernel time by kind: matrix products (cuBLAS/CUTLASS/nvjet kernels), attention (flash/memory-efficient
  kernels), Triton kernels (what compilation fused), normalisation/softmax/dropout/GELU and other elementwise or
  reduction kernels, the optimizer's multi-tensor kernels, copies and fills; and the top kernels by time;
- the matrix products' own rate: the step's model FLOPs (nearly all of them products) over the products' time.

    PYTHONPATH=src python bench/gpu_profile.py --out OUT_DIR            (BERT-Base, 256 x 128, CUDA)
    PYTHONPATH=src python bench/gpu_profile.py --out OUT_DIR --quick --device cpu    (the smoke test)

Writes OUT_DIR/profile.json, OUT_DIR/profile.md and each variant's chrome trace (gzipped).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import time
from pathlib import Path

import torch
from gpu import build, pretraining_batches, reference_state, shapes, sync

from bert.distributed import autocast
from bert.optimization import create_optimizer
from bert.training import compile_model

# Kernel kinds, the first pattern that matches a kernel's name (lower case) wins.
KINDS = (
    ("attention", r"flash|fmha|attention|attn"),
    ("optimizer", r"multi_tensor|foreach|adam"),
    ("matrix products", r"^triton_tem"),  # compilation's own product templates
    ("triton (fused by compile)", r"^triton"),
    ("matrix products", r"gemm|cutlass|nvjet|xmma|cublas|sm\d+_.*(tn|nt|nn)"),
    ("normalisation", r"layer_norm|layernorm|norm"),
    ("softmax", r"softmax"),
    ("dropout", r"dropout|philox|bernoulli|rand"),
    ("gather, scatter, index", r"index|gather|scatter|embedding|cat|take"),
    ("reductions", r"reduce"),
    ("other elementwise", r"elementwise|vectorized|unrolled|distribution|copy|fill"),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, low)), "other kernels")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def analyse(trace: dict, wall_s: float, flops: float, steps: int) -> dict:
    """Kernel time by kind, busy time and the top kernels, from a chrome trace's device events."""
    device_events = [
        e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    kinds: dict[str, str] = {}
    for e in device_events:
        kind = kinds.setdefault(e["name"], "copies and fills" if e["cat"] != "kernel" else kind_of(e["name"]))
        by_kind[kind] = by_kind.get(kind, 0.0) + e["dur"]
        by_name.setdefault(e["name"], []).append(e["dur"])
    kernel_us = sum(by_kind.values())
    busy = busy_us([(e["ts"], e["ts"] + e["dur"]) for e in device_events])
    launches = sum(1 for e in trace["traceEvents"] if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", ""))
    products = by_kind.get("matrix products", 0.0) + by_kind.get("attention", 0.0)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    return {
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall_s / steps,
        "gpu_busy_ms_per_step": busy / 1e3 / steps,
        "gpu_busy_fraction": busy / 1e6 / wall_s if wall_s else None,
        "kernel_ms_per_step": kernel_us / 1e3 / steps,
        "kernels_per_step": len(device_events) / steps,
        "launches_per_step": launches / steps,
        "ms_per_step_by_kind": {k: v / 1e3 / steps for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "model_tflops": flops / wall_s / 1e12,
        # The model FLOPs are the products' and attention's: their rate over those kernels' time alone.
        "products_tflops": flops / (products / 1e6) / 1e12 if products else None,
        "top_kernels": [
            {"name": n[:160], "kind": kinds[n], "calls_per_step": len(d) / steps, "ms_per_step": sum(d) / 1e3 / steps}
            for n, d in top
        ],
    }


def profile_variant(name: str, compiled: bool, args, device: torch.device, out: Path) -> dict:
    c = shapes(args)["base"]
    batch, seq, preds = (4, 32, 5) if args.quick else (256, 128, 20)
    state = reference_state("pretraining", c, device)
    batches = [b.to(device) for b in pretraining_batches(c, 4, batch, seq, preds, seed=0)]
    model = build("pretraining", "ours", c, state, device).train()
    if compiled:
        torch._dynamo.reset()
        compile_model(model)
    optimizer, _ = create_optimizer(model, 1e-5, 1000, 0)

    def step(i: int) -> None:
        with autocast(device, "bf16"):
            loss = model(**batches[i % len(batches)].ours).total_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    start = time.perf_counter()
    for i in range(len(batches) if compiled else args.warmup):  # a compiled model compiles each new shape here
        step(i)
    sync(device)
    warmup_s = time.perf_counter() - start
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        sync(device)
        start = time.perf_counter()
        for i in range(args.steps):
            step(i)
        sync(device)
        wall = time.perf_counter() - start
    trace_path = out / f"trace_{name}.json"
    prof.export_chrome_trace(str(trace_path))
    trace = json.loads(trace_path.read_text())
    with trace_path.open("rb") as src, gzip.open(f"{trace_path}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace_path.unlink()
    flops = sum(batches[i % len(batches)].flops for i in range(args.steps))
    result = {"variant": name, "shape": f"{batch} x {seq}", "warmup_s": warmup_s}
    result.update(analyse(trace, wall, flops, args.steps))
    result["mfu"] = result["model_tflops"] * 1e12 / args.peak_flops
    print(report([result]), flush=True)
    torch._dynamo.reset()
    return result


def report(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines += [
            f"\n### {r['variant']} ({r['shape']}, {r['steps']} traced steps, warm-up {r['warmup_s']:.1f} s)",
            f"step {r['wall_ms_per_step']:.2f} ms, GPU busy {r['gpu_busy_ms_per_step']:.2f} ms "
            f"({100 * (r['gpu_busy_fraction'] or 0):.1f}%), kernels {r['kernel_ms_per_step']:.2f} ms in "
            f"{r['kernels_per_step']:.0f} kernels ({r['launches_per_step']:.0f} launches) a step; "
            f"{r['model_tflops']:.1f} model TFLOP/s (MFU {100 * r['mfu']:.1f}%)"
            + (f", products and attention at {r['products_tflops']:.1f} TFLOP/s" if r["products_tflops"] else ""),
            "",
            "| kernel kind | ms/step | share of kernel time |",
            "|---|---:|---:|",
        ]
        total = r["kernel_ms_per_step"] or 1.0
        lines += [f"| {k} | {v:.2f} | {100 * v / total:.1f}% |" for k, v in r["ms_per_step_by_kind"].items()]
        lines += ["", "| top kernels | kind | calls/step | ms/step |", "|---|---|---:|---:|"]
        lines += [
            f"| `{k['name'][:90]}` | {k['kind']} | {k['calls_per_step']:.0f} | {k['ms_per_step']:.3f} |"
            for k in r["top_kernels"]
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny shapes (the CPU smoke test)")
    p.add_argument("--variants", default="eager,compiled")
    p.add_argument("--steps", type=int, default=5, help="traced steps of each variant")
    p.add_argument("--warmup", type=int, default=5, help="eager steps before the trace")
    p.add_argument("--peak_flops", type=float, default=788e12, help="the device's bf16 matmul peak (the H200's)")
    args = p.parse_args()
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.variants.split(","):
        results.append(profile_variant(name, name == "compiled", args, device, out))
        (out / "profile.json").write_text(json.dumps(results, indent=1))
        (out / "profile.md").write_text(report(results) + "\n")


if __name__ == "__main__":
    main()
