"""Model forward throughput (sequences/s), ours vs transformers' BertModel with the same weights.

Padded batches of real GLUE dev sentences (SST-2, or MRPC pairs) at max_seq_length 128, at BERT-Tiny and
BERT-Base shapes, fp32, on whatever device is available. Prints a table and the ratio ours / theirs.

    python bench/bench_model.py [--shapes tiny,base] [--batches 4] [--batch_size 32]
"""

from __future__ import annotations

import argparse
import csv
import platform
import time
from pathlib import Path

import torch

from bert.config import named_config
from bert.extract_features import truncate_seq_pair
from bert.modeling import BertModel
from bert.tokenization import FullTokenizer

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def load_batches(batch_size: int, n_batches: int, max_len: int = 128) -> list[dict[str, torch.Tensor]]:
    tokenizer = FullTokenizer(str(SHARED / "vocab" / "uncased.txt"), do_lower_case=True)
    with open(SHARED / "glue" / "MRPC" / "dev.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    batches = []
    for b in range(n_batches):
        ids, types = [], []
        for row in rows[b * batch_size : (b + 1) * batch_size]:
            a, c = tokenizer.tokenize(row[3]), tokenizer.tokenize(row[4])
            truncate_seq_pair(a, c, max_len - 3)
            tokens = ["[CLS]", *a, "[SEP]", *c, "[SEP]"]
            ids.append(tokenizer.convert_tokens_to_ids(tokens))
            types.append([0] * (len(a) + 2) + [1] * (len(c) + 1))
        pad = [[0] * (max_len - len(x)) for x in ids]
        batches.append(
            {
                "input_ids": torch.tensor([x + p for x, p in zip(ids, pad)]),
                "token_type_ids": torch.tensor([x + p for x, p in zip(types, pad)]),
                "attention_mask": torch.tensor([[1] * len(x) + p for x, p in zip(ids, pad)]),
            }
        )
    return batches


@torch.no_grad()
def seqs_per_second(fn, batches, device, repeats: int = 2) -> float:
    fn(**{k: v.to(device) for k, v in batches[0].items()})  # warm-up
    best = 0.0
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        n = 0
        for batch in batches:
            fn(**{k: v.to(device) for k, v in batch.items()})
            n += batch["input_ids"].shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="tiny,base")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = load_batches(args.batch_size, args.batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches) / sum(b["input_ids"].numel() for b in batches)
    print(
        f"device={device} torch={torch.__version__} transformers={transformers.__version__} "
        f"threads={torch.get_num_threads()} cpu={platform.processor() or platform.machine()}"
    )
    print(f"{len(batches)} batches x {args.batch_size} MRPC dev pairs, padded to 128 ({real:.0%} real tokens)")
    print(f"{'shape':8} {'ours seq/s':>11} {'hf sdpa':>9} {'hf eager':>9} {'ours/sdpa':>10} {'ours/eager':>11}")
    for shape in args.shapes.split(","):
        config = named_config(shape)
        torch.manual_seed(0)
        ours = BertModel(config).to(device).eval()
        rates = {"ours": seqs_per_second(ours, batches, device)}
        for impl in ("sdpa", "eager"):
            hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"})
            hf_config._attn_implementation = impl
            hf = transformers.BertModel(hf_config).to(device).eval()
            hf.load_state_dict(ours.state_dict(), strict=False)
            rates[impl] = seqs_per_second(hf, batches, device)
        print(
            f"{shape:8} {rates['ours']:11.1f} {rates['sdpa']:9.1f} {rates['eager']:9.1f} "
            f"{rates['ours'] / rates['sdpa']:10.2f} {rates['ours'] / rates['eager']:11.2f}"
        )


if __name__ == "__main__":
    main()
