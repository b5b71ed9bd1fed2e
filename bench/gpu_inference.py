"""GPU embedding throughput: `Predictor.embed` (what `bert embed` runs) against transformers and
sentence-transformers on the same weights, sentences, batch size and number type, in one run.

    python bench/gpu_inference.py --out DIR [--shapes minilm,base] [--dtypes float32,bfloat16,float16]

CPU smoke test (tiny shapes, a few sentences): python bench/gpu_inference.py --device cpu --quick --out DIR

Shapes: all-MiniLM-L6-v2's (6 layers, hidden 384, mean pooling, normalised) and BERT-Base's (12 x 768) with the
same sentence-transformers modules. The weights are drawn at random (seed 0) and saved once in the transformers
layout with the sentence-transformers files beside them, so that all three load the same directory; the speed
does not depend on the weights' values (a device machine has no copy of the pre-trained ones). The tokenizer
files are BERT's uncased WordPiece (`--vocab`).
Sentences: every sentence of the GLUE dev sets found (SST-2, MRPC and STS-B pairs as two inputs, QNLI, RTE),
up to `--limit`, cut at 128 tokens by all three. Each side gets the model in the dtype of the row:
- ours: `Predictor.from_pretrained(dir, device, dtype=...)`, `embed(sentences, batch_size=B)` (length-sorted
  batches, unpadded encoder, the Transformer blocks in the dtype);
- transformers: `AutoModel.from_pretrained(dir, dtype=...)` and its fast tokenizer in a batch loop over the
  sentences in order, each batch padded to its longest, mean pooling and L2 normalisation as the
  sentence-transformers model card shows;
- sentence-transformers: `SentenceTransformer(dir, device, model_kwargs={"dtype": ...}).encode(batch_size=B)`
  (it sorts by length too).
Each timing is the best of `--repeats` after a warm-up pass, the device synchronised before the clock is read
(every side returns its vectors on the host). The report gives sentences/s and ours / peer, and the least
cosine between ours and each peer (same weights: a check that all three compute the same embedding).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
DATA_DIRS = (REPO.parent / "shared" / "data", REPO / "shared" / "data")
SHAPES = {"minilm": (6, 384, 12, 1536), "base": (12, 768, 12, 3072), "tiny": (2, 64, 2, 256)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_SEQ = 128


def glue_sentences(data: Path, limit: int) -> list[str]:
    """GLUE dev sentences: (file, columns with a header row) of each task present."""
    tables = {
        "SST-2": ["sentence"],
        "MRPC": ["#1 String", "#2 String"],
        "STS-B": ["sentence1", "sentence2"],
        "QNLI": ["question", "sentence"],
        "RTE": ["sentence1", "sentence2"],
    }
    out: list[str] = []
    for task, columns in tables.items():
        path = data / "glue" / task / "dev.tsv"
        if not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8-sig").splitlines()
        header = lines[0].split("\t")
        idx = [header.index(c) for c in columns]
        for line in lines[1:]:
            cells = line.split("\t")
            out += [cells[i] for i in idx if i < len(cells) and cells[i].strip()]
    return out[:limit]


def make_model_dir(root: Path, shape: str, vocab: Path) -> Path:
    """A sentence-transformers directory (transformers weights + modules) of `shape`, random weights, seed 0."""
    import transformers

    layers, hidden, heads, inner = SHAPES[shape]
    path = root / shape
    vocab_size = sum(1 for _ in vocab.open(encoding="utf-8"))
    config = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(path)
    shutil.copy(vocab, path / "vocab.txt")
    transformers.BertTokenizerFast(str(path / "vocab.txt"), do_lower_case=True).save_pretrained(path)
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True}), encoding="utf-8"
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (path / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_SEQ, "do_lower_case": False}), encoding="utf-8"
    )
    return path


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], np.ndarray], repeats: int, device: torch.device) -> tuple[float, np.ndarray]:
    out = fn()  # warm-up: kernels chosen, caches allocated
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best, out


def ours(model_dir: Path, device: torch.device, dtype: str, batch: int) -> Callable[[list[str]], np.ndarray]:
    from bert.inference import Predictor

    predictor = Predictor.from_pretrained(model_dir, device, dtype=dtype, batch_size=batch)
    return lambda texts: predictor.embed(texts, batch_size=batch)


def transformers_loop(
    model_dir: Path, device: torch.device, dtype: str, batch: int
) -> Callable[[list[str]], np.ndarray]:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=DTYPES[dtype], attn_implementation="sdpa").to(device).eval()

    def run(texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), batch):
            enc = tokenizer(
                texts[i : i + batch], padding=True, truncation=True, max_length=MAX_SEQ, return_tensors="pt"
            ).to(device)
            with torch.inference_mode():
                hidden = model(**enc).last_hidden_state.float()  # [B, T, H]
            mask = enc["attention_mask"][:, :, None].float()
            vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=1)
            out.append(vectors.cpu().numpy())
        return np.concatenate(out)

    return run


def st_encode(model_dir: Path, device: torch.device, dtype: str, batch: int) -> Callable[[list[str]], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=str(device), model_kwargs={"dtype": DTYPES[dtype]})
    return lambda texts: np.asarray(
        model.encode(texts, batch_size=batch, convert_to_numpy=True), dtype=np.float32
    ).reshape(len(texts), -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--out", default="bench/out/gpu_inference")
    parser.add_argument("--shapes", default="minilm,base")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--limit", type=int, default=100_000, help="sentences at most")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the tiny shape and 64 sentences (CPU smoke test)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--model_root", default=None, help="keep the model directories here (default: a temporary one)")
    parser.add_argument("--vocab", default=None, help="vocab.txt (default: the data folder's vocab/uncased.txt)")
    args = parser.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    data = Path(args.data_dir) if args.data_dir else next(d for d in DATA_DIRS if d.is_dir())
    vocab = Path(args.vocab) if args.vocab else data / "vocab" / "uncased.txt"
    shapes = ["tiny"] if args.quick else args.shapes.split(",")
    dtypes = args.dtypes.split(",")
    if device.type == "cpu":
        dtypes = [d for d in dtypes if d != "float16"]  # float16 runs on CUDA only (--dtype's rule)
    sentences = glue_sentences(data, 64 if args.quick else args.limit)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    meta = {
        "date": datetime.date.today().isoformat(),
        "command": "python bench/gpu_inference.py " + " ".join(sys.argv[1:]),
        "device_name": name,
        "torch": torch.__version__,
        "sentences": len(sentences),
        "batch_size": args.batch_size,
    }
    print(f"{name}; torch {torch.__version__}; {len(sentences)} GLUE dev sentences; batch {args.batch_size}")
    sides = {"ours": ours, "transformers": transformers_loop, "sentence-transformers": st_encode}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.model_root or tmp)
        for shape in shapes:
            model_dir = make_model_dir(root, shape, vocab)
            for dtype in dtypes:
                results: dict[str, tuple[float, np.ndarray]] = {}
                for side, make in sides.items():
                    try:
                        fn = make(model_dir, device, dtype, args.batch_size)
                        results[side] = best_time(lambda fn=fn: fn(sentences), args.repeats, device)
                    except Exception as e:  # a peer that fails is reported, the rest go on
                        print(f"  {shape} {dtype} {side}: ERROR {type(e).__name__}: {str(e)[:200]}")
                    finally:
                        fn = None
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                if "ours" not in results:
                    continue
                our_seconds, our_vectors = results["ours"]
                for side, (seconds, vectors) in results.items():
                    cosine = float((our_vectors * vectors).sum(1).min()) if vectors.shape == our_vectors.shape else None
                    row = {
                        "shape": shape,
                        "dtype": dtype,
                        "side": side,
                        "seq_per_s": len(sentences) / seconds,
                        "ours_over_side": seconds / our_seconds,
                        "least_cosine_to_ours": cosine,
                    }
                    rows.append(row)
                    print(
                        f"  {shape:>6} {dtype:>8} {side:>22}: {row['seq_per_s']:10.0f} seq/s   "
                        f"ours/this {row['ours_over_side']:5.2f}x   least cosine to ours {cosine}",
                        flush=True,
                    )
    lines = [
        f"# GPU embedding throughput, {meta['date']}, {name}, torch {torch.__version__}",
        "",
        f"`{meta['command']}`: {len(sentences)} GLUE dev sentences, batch {args.batch_size}, <= {MAX_SEQ} tokens.",
        "",
        "| shape | dtype | engine | sentences/s | ours / engine | least cosine to ours |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        cos = "-" if r["least_cosine_to_ours"] is None else f"{r['least_cosine_to_ours']:.5f}"
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {r['side']} | {r['seq_per_s']:,.0f} | "
            f"{r['ours_over_side']:.2f}x | {cos} |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_inference.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "gpu_inference.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
