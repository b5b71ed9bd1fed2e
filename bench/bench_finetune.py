"""Fine-tuning throughput (training examples/s): `bert classify` vs a plain transformers training loop.

SST-2, the first `--train_examples` training sentences, max_seq_length 128, batch 32, fp32, on the CPU,
at the BERT-Mini (L-4_H-256) or BERT-Tiny (L-2_H-128) shape with random weights and the uncased vocab.

- ours: the `bert classify --do_train` command itself (`run_classify`): length-grouped batches, each padded
  to its own longest sentence, the unpadded encoder, the original's optimizer and schedule, clipping at 1.0.
  Throughput from the Trainer's per-step timings (`metrics.jsonl`), and end to end (the whole command:
  reading, tokenizing, training, saving the checkpoint and the model).
- ours, padded: the same command with `--pad_to_max_seq_length --group_by_length=false` (the original's
  fixed padding), to separate what dynamic padding gives from the rest.
- transformers: `transformers.BertForSequenceClassification` with the same config and weights, the same
  features padded to 128 (our tokenizer, so both see the same tokens), shuffled batches of 32,
  `torch.optim.AdamW(fused=True)` (transformers' Trainer default, `adamw_torch_fused`) with a linear
  warmup/decay schedule and clipping at 1.0; a plain loop. Throughput of
  its training steps, and end to end as ours: reading and tokenizing the data, loading the model, the
  training steps, saving the model (`save_pretrained`) and the optimizer state, so the end-to-end ratio
  divides like by like.

The first `--skip` steps of each are not timed (warm-up). The machine may be shared, so the two runs
alternate `--repeats` times and the best of each is kept. Ratio = ours / transformers (above 1: faster), training
steps against training steps, end to end against end to end.

    python bench/bench_finetune.py [--shape mini] [--train_examples 2000] [--repeats 2] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from isa import add_argument as add_isa_argument  # this folder is sys.path[0]
from isa import apply as apply_isa
from isa import cpu_name

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


def slice_sst2(src: Path, dst: Path, n: int) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    lines = (src / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    (dst / "train.tsv").write_text("".join(lines[: n + 1]), encoding="utf-8")
    return dst


def make_init(shape: str, vocab: Path, out: Path) -> Path:
    from bert.checkpoint import save_pretrained
    from bert.config import named_config
    from bert.modeling import BertForPreTraining

    config = named_config(shape, vocab_size=30522)
    config.max_position_embeddings = 512
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(config), out, vocab, do_lower_case=True)
    return out


def run_ours(data: Path, init: Path, out: Path, batch: int, skip: int, fixed: bool = False) -> dict[str, float]:
    from bert.commands.classify import ClassifyArgs, run_classify

    args = ClassifyArgs(
        task_name="sst-2",
        data_dir=str(data),
        output_dir=str(out),
        init_checkpoint=str(init),
        do_train=True,
        max_seq_length=128,
        train_batch_size=batch,
        learning_rate=2e-5,
        num_train_epochs=1.0,
        log_every=1,
        save_checkpoints_steps=10**9,
        device="cpu",
        pad_to_max_seq_length=fixed,
        group_by_length=not fixed,
    )
    start = time.perf_counter()
    result = run_classify(args)
    total = time.perf_counter() - start
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = steps[skip:]
    seconds = sum(batch / s["sequences_per_second"] for s in timed)
    return {
        "examples_per_s": batch * len(timed) / seconds,
        "end_to_end_examples_per_s": batch * result["num_train_steps"] / total,
        "steps": result["num_train_steps"],
    }


def run_transformers(data: Path, init: Path, out_dir: Path, batch: int, steps: int, skip: int) -> dict[str, float]:
    import transformers

    from bert.tasks import get_processor
    from bert.tasks.glue import convert_examples_to_features, features_to_arrays
    from bert.tokenization import FullTokenizer

    begin = time.perf_counter()  # end to end from here, as ours from run_classify's call: imports done
    processor = get_processor("sst-2")
    examples = processor.get_train_examples(data)
    tokenizer = FullTokenizer(init / "vocab.txt", do_lower_case=True)
    arrays = features_to_arrays(convert_examples_to_features(examples, processor.get_labels(), 128, tokenizer))
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    model = transformers.BertForSequenceClassification.from_pretrained(str(init), num_labels=2).train()
    no_decay = [p for n, p in model.named_parameters() if "LayerNorm" in n or "bias" in n]
    decay = [p for n, p in model.named_parameters() if not ("LayerNorm" in n or "bias" in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], 2e-5, fused=True
    )
    sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
    order = np.random.default_rng(0).permutation(len(examples))
    times = []
    for step in range(steps):
        idx = torch.from_numpy(order[(step * batch) % len(order) :][:batch])
        start = time.perf_counter()
        out = model(
            input_ids=tensors["input_ids"][idx],
            attention_mask=tensors["input_mask"][idx],
            token_type_ids=tensors["segment_ids"][idx],
            labels=tensors["label_ids"][idx],
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    model.save_pretrained(out_dir)
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, out_dir / "training_state.pt")
    total = time.perf_counter() - begin
    timed = times[skip:]
    return {
        "examples_per_s": batch * len(timed) / sum(timed),
        "end_to_end_examples_per_s": batch * steps / total,
        "real_token_share": float(arrays["input_mask"].mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="mini", help="a released shape: tiny, mini, small, ...")
    parser.add_argument("--train_examples", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--skip", type=int, default=3, help="untimed warm-up steps")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--data_dir", default=str(SHARED / "glue" / "SST-2"))
    parser.add_argument("--vocab_file", default=str(SHARED / "vocab" / "uncased.txt"))
    add_isa_argument(parser)
    a = parser.parse_args()
    apply_isa(a.isa)
    if a.threads:
        torch.set_num_threads(a.threads)
    import logging

    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = slice_sst2(Path(a.data_dir), tmp / "data", a.train_examples)
        init = make_init(a.shape, Path(a.vocab_file), tmp / "init")
        ours, fixed, theirs = [], [], []
        for r in range(a.repeats):
            ours.append(run_ours(data, init, tmp / f"out{r}", a.batch_size, a.skip))
            fixed.append(run_ours(data, init, tmp / f"fixed{r}", a.batch_size, a.skip, fixed=True))
            theirs.append(run_transformers(data, init, tmp / f"theirs{r}", a.batch_size, ours[-1]["steps"], a.skip))
            print(f"repeat {r}: ours {ours[-1]}, ours padded {fixed[-1]}, transformers {theirs[-1]}", flush=True)
    import transformers

    best_ours = max(o["examples_per_s"] for o in ours)
    best_e2e = max(o["end_to_end_examples_per_s"] for o in ours)
    best_hf = max(t["examples_per_s"] for t in theirs)
    best_hf_e2e = max(t["end_to_end_examples_per_s"] for t in theirs)
    best_fixed = max(o["examples_per_s"] for o in fixed)
    print(
        f"\n{time.strftime('%Y-%m-%d')}, {cpu_name()}, {torch.get_num_threads()} "
        f"threads, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    print(
        f"SST-2 {a.train_examples} examples, shape {a.shape}, batch {a.batch_size}, max_seq_length 128, "
        f"{ours[0]['steps']} steps, real tokens {theirs[0]['real_token_share']:.0%} of 128"
    )
    print("| | examples/s |\n|---|---:|")
    print(f"| bert classify (training steps) | {best_ours:.1f} |")
    print(f"| bert classify (end to end) | {best_e2e:.1f} |")
    print(f"| bert classify --pad_to_max_seq_length --group_by_length=false (training steps) | {best_fixed:.1f} |")
    print(f"| transformers loop, padded to 128 (training steps) | {best_hf:.1f} |")
    print(f"| transformers loop, padded to 128 (end to end) | {best_hf_e2e:.1f} |")
    print(f"| ratio (training steps) | {best_ours / best_hf:.2f}x |")
    print(f"| ratio (end to end, both) | {best_e2e / best_hf_e2e:.2f}x |")
    print(f"| ratio, both padded to 128 (training steps) | {best_fixed / best_hf:.2f}x |")


if __name__ == "__main__":
    main()
