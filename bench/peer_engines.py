"""One peer engine in a process of its own, driven by bench/bench_peers.py (embedders) or
bench/bench_rerank_peers.py (cross-encoders, the `ce_` engines) over stdin/stdout.

The peers pin transformers apart from each other and from this project's environment (sentence-transformers'
ONNX backend needs optimum-onnx, which needs transformers < 4.58; its OpenVINO backend needs optimum-intel,
transformers < 5.6), so each may run under another Python (`bench_peers.py --onnx_python/--openvino_python`).
This file imports neither `bert` nor anything of the bench folder for that reason, but bench/isa.py (standard
library only).

    python bench/peer_engines.py --engine st_onnx --model DIR --work DIR --texts texts.json

Each engine is built as its own documentation shows (sentence-transformers' "Speeding up Inference" page:
`backend="onnx"` / `backend="openvino"`, `export_dynamic_quantized_onnx_model`,
`export_static_quantized_openvino_model`; fastembed's custom-model page: `TextEmbedding.add_custom_model` on
an ONNX export by optimum; `CrossEncoder(..., backend=...)` for the cross-encoders, whose sets are lists of
{"query", "documents"}, each scored as `CrossEncoder.predict` scores a query's pairs). Then one line on stdout
says it is ready; each line read on stdin names a set of texts in texts.json, which the engine embeds (or
scores) in batches of `--batch_size`, timed here so that the pipe is not; the answer line holds the seconds and
the .npy of the embeddings (or scores).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from isa import CAPS, cpu_flags  # this folder is sys.path[0]

ENGINES = ("st_torch", "st_onnx", "st_onnx_int8", "st_openvino", "st_openvino_f32", "st_openvino_int8", "fastembed")
CROSS_ENCODERS = ("ce_torch", "ce_onnx", "ce_openvino", "ce_openvino_f32")
# OpenVINO's precision hint for float32 (it runs a float32 model in bfloat16 by default where the CPU has bf16
# instructions), through the optimum-intel model's ov_config.
OPENVINO_F32 = {"ov_config": {"INFERENCE_PRECISION_HINT": "f32"}}


def onnx_quantization_config(isa: str) -> str:
    """sentence-transformers' ONNX int8 preset for this CPU, or for an AVX2 one under `--isa avx2` (the presets are
    "arm64", "avx2", "avx512", "avx512_vnni"; its docs say to pick the one the CPU supports)."""
    if isa == "avx2":
        return "avx2"
    flags = cpu_flags()
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    return "avx512" if "avx512f" in flags else "avx2"


def build(engine: str, model_dir: Path, work: Path, threads: int, batch_size: int, calibration: Path | None, isa: str):
    """(embed function of a list of texts -> float32 array, a note on how it was built)."""
    # sentence-transformers saves its exports next to the model (onnx/, openvino/): a copy of its own.
    local = work / engine / "model"
    if not local.exists():
        shutil.copytree(model_dir, local)
    if engine == "fastembed":
        return build_fastembed(local, work / engine, threads, batch_size)
    if engine in CROSS_ENCODERS:
        return build_cross_encoder(engine, local, threads, batch_size, isa)
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    if isa == "avx2" and engine.startswith("st_openvino"):
        openvino_in_float32()
    note = ""
    if engine == "st_torch":
        model = SentenceTransformer(str(local), device="cpu")
    elif engine == "st_onnx":
        model = SentenceTransformer(str(local), device="cpu", backend="onnx")
    elif engine == "st_onnx_int8":
        from sentence_transformers import export_dynamic_quantized_onnx_model

        config = onnx_quantization_config(isa)
        export_dynamic_quantized_onnx_model(
            SentenceTransformer(str(local), device="cpu", backend="onnx"), config, str(local)
        )
        # Its file is model_qint8_<preset>.onnx, or model_quint8_avx2.onnx (the avx2 preset's weights are unsigned).
        file_name = next((local / "onnx").glob(f"model_*int8_{config}.onnx")).relative_to(local).as_posix()
        model = SentenceTransformer(str(local), device="cpu", backend="onnx", model_kwargs={"file_name": file_name})
        note = f"export_dynamic_quantized_onnx_model, preset {config}"
    elif engine == "st_openvino":
        model = SentenceTransformer(str(local), device="cpu", backend="openvino")
        note = f"OpenVINO's default inference precision on this CPU: {openvino_default_precision()}"
    elif engine == "st_openvino_f32":
        model = SentenceTransformer(str(local), device="cpu", backend="openvino", model_kwargs=OPENVINO_F32)
        note = "ov_config INFERENCE_PRECISION_HINT=f32"
    elif engine == "st_openvino_int8":
        model, note = build_openvino_int8(local, calibration)
    else:
        raise SystemExit(f"--engine: unknown {engine!r}; one of {', '.join(ENGINES + CROSS_ENCODERS)}")
    if engine.startswith("st_openvino"):
        note += f"; kernels: {openvino_kernels(model)}"

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, batch_size=batch_size, normalize_embeddings=True), np.float32)

    return embed, note


def precision(engine: str) -> str:
    """The number type the engine computes in: int8 exports, OpenVINO's default (bf16 where the CPU has it),
    float32 otherwise."""
    if engine.endswith("_int8"):
        return "int8"
    if engine in ("st_openvino", "ce_openvino"):
        return {"bf16": "bf16", "f16": "fp16"}.get(openvino_default_precision(), "fp32")
    return "fp32"


def openvino_default_precision() -> str:
    """The precision OpenVINO's CPU plugin runs a float32 model in by default here (f32, or bf16 / f16 where the
    CPU has those instructions)."""
    import openvino

    return openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()


def openvino_kernels(model) -> str:
    """The kernels OpenVINO compiled the model's GEMMs and attention into (its runtime graph after one call):
    which are MLAS and which oneDNN, for which instructions and in which precision."""
    model.encode(["a first call compiles the kernels for dynamic shapes"])
    counts: collections.Counter[str] = collections.Counter()
    for op in model[0].auto_model.request.get_runtime_model().get_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str)
        if layer in ("FullyConnected", "MatMul", "Subgraph", "ScaledDotProductAttention"):
            counts[f"{layer} {info['primitiveType'].astype(str)} {info['runtimePrecision'].astype(str)}"] += 1
    return ", ".join(f"{n} {kernel}" for kernel, n in sorted(counts.items()))


def openvino_in_float32() -> None:
    """Every model OpenVINO compiles in this process runs its float layers in float32, its default on a CPU without
    bfloat16 instructions: OpenVINO reads bf16 support from CPUID, past `--isa avx2`'s cap, and then finds no
    kernel under the cap (its Softmax first). The calibration pass of its int8 export compiles models too."""
    import openvino

    compile_model = openvino.Core.compile_model

    def compile_in_float32(self, model, device_name=None, config=None):
        return compile_model(self, model, device_name, {"INFERENCE_PRECISION_HINT": "f32", **(config or {})})

    openvino.Core.compile_model = compile_in_float32


def build_openvino_int8(local: Path, calibration: Path | None):
    from optimum.intel import OVQuantizationConfig
    from sentence_transformers import SentenceTransformer, export_static_quantized_openvino_model

    if calibration is None:
        raise SystemExit("--calibration: st_openvino_int8 needs the folder of a train.csv with a `sentence` column")
    # Its default calibration set is GLUE SST-2 train, from the Hub: the same sentences, read from a local CSV.
    export_static_quantized_openvino_model(
        SentenceTransformer(str(local), device="cpu", backend="openvino"),
        OVQuantizationConfig(),
        str(local),
        dataset_name=str(calibration),
        dataset_config_name="default",
        dataset_split="train",
        column_name="sentence",
    )
    file_name = "openvino/openvino_model_qint8_quantized.xml"
    model = SentenceTransformer(str(local), device="cpu", backend="openvino", model_kwargs={"file_name": file_name})
    return model, "export_static_quantized_openvino_model, static int8 calibrated on SST-2 train"


def build_cross_encoder(engine: str, local: Path, threads: int, batch_size: int, isa: str):
    """sentence-transformers' CrossEncoder on the torch, ONNX or OpenVINO backend (its "Speeding up Inference"
    page); each query's documents scored in one `predict` call, sigmoid scores (its default for one label)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(threads)
    if isa == "avx2" and "openvino" in engine:
        openvino_in_float32()
    backend = {"ce_torch": "torch", "ce_onnx": "onnx"}.get(engine, "openvino")
    kwargs = {"model_kwargs": OPENVINO_F32} if engine == "ce_openvino_f32" else {}
    model = CrossEncoder(str(local), device="cpu", backend=backend, **kwargs)
    note = f"CrossEncoder backend={backend}" + ("; ov_config INFERENCE_PRECISION_HINT=f32" if kwargs else "")

    def score(items: list[dict]) -> np.ndarray:
        return np.concatenate(
            [
                np.asarray(model.predict([(i["query"], d) for d in i["documents"]], batch_size=batch_size), np.float32)
                for i in items
            ]
        )

    return score, note


def build_fastembed(local: Path, work: Path, threads: int, batch_size: int):
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType
    from optimum.exporters.onnx import main_export

    exported = work / "onnx"
    if not (exported / "model.onnx").exists():
        main_export(str(local), output=str(exported), task="feature-extraction")
        # fastembed truncates at tokenizer_config.json's max_length, which the export copies from tokenizer.json's
        # 128; the model's max_seq_length (256, what sentence-transformers and ours read) instead, so that every
        # engine embeds the same tokens of a passage.
        config_file = exported / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config["max_length"] = json.loads((local / "sentence_bert_config.json").read_text())["max_seq_length"]
        config_file.write_text(json.dumps(config, indent=2), encoding="utf-8")
    name = "bench/all-MiniLM-L6-v2"
    TextEmbedding.add_custom_model(
        model=name,
        pooling=PoolingType.MEAN,
        normalization=True,
        sources=ModelSource(hf=name),
        dim=384,
        model_file="model.onnx",
    )
    model = TextEmbedding(model_name=name, specific_model_path=str(exported), threads=threads)

    def embed(texts: list[str]) -> np.ndarray:
        return np.stack(list(model.embed(texts, batch_size=batch_size))).astype(np.float32)

    max_length = json.loads((exported / "tokenizer_config.json").read_text(encoding="utf-8"))["max_length"]
    return embed, f"optimum main_export, TextEmbedding.add_custom_model, mean pooling, max_length {max_length}"


def versions(engine: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    names = ["transformers", "sentence-transformers", "torch", "onnxruntime", "openvino", "optimum", "fastembed"]
    names += ["optimum-onnx" if "onnx" in engine or engine == "fastembed" else "optimum-intel"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return ", ".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", required=True, choices=ENGINES + CROSS_ENCODERS)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--texts", required=True, type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--calibration", type=Path, help="folder of a train.csv with a `sentence` column")
    parser.add_argument(
        "--isa", choices=("native", *CAPS), default="native", help="avx2: bench_peers.py has capped the kernels"
    )
    args = parser.parse_args()
    # The answers go to the real stdout; anything the libraries print goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr
    texts = json.loads(args.texts.read_text(encoding="utf-8"))
    embed, note = build(args.engine, args.model, args.work, args.threads, args.batch_size, args.calibration, args.isa)
    ready = {"ready": True, "note": note, "versions": versions(args.engine), "precision": precision(args.engine)}
    answers.write(json.dumps(ready) + "\n")
    for line in sys.stdin:
        name = line.strip()
        start = time.perf_counter()
        vectors = embed(texts[name])
        seconds = time.perf_counter() - start
        path = args.work / f"{args.engine}.{name}.npy"
        np.save(path, vectors)
        answers.write(json.dumps({"seconds": seconds, "embeddings": str(path)}) + "\n")


if __name__ == "__main__":
    main()
