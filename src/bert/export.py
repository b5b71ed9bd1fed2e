"""Export a model to ONNX or TorchScript, checked against the eager model before anything is written.

The exported graph takes three int64 tensors, `input_ids`, `attention_mask` and `token_type_ids`, of
shape [batch_size, sequence_length] ([batch_size, num_choices, sequence_length] for multiple choice),
every axis dynamic, and returns plain tensors under transformers' output names, so code written for
transformers' ONNX exports runs on these:

    BertModel                       last_hidden_state [B, T, H], pooler_output [B, H]
    BertForPreTraining              prediction_logits [B, T, V], seq_relationship_logits [B, 2]
    BertForSequenceClassification   logits [B, L]
    BertForTokenClassification      logits [B, T, L]
    BertForQuestionAnswering        start_logits [B, T], end_logits [B, T]
    BertForMultipleChoice           logits [B, C]

The graph is the model's padded path (`set_unpad(False)`): the unpadded path's shapes depend on the
data, and runtimes pad their batches themselves. ONNX graphs come from torch's `torch.export`-based
exporter (the TorchScript-based one is deprecated) at opset 18 (ONNX Runtime 1.14 or later);
TorchScript files from `torch.jit.trace`.

Before the file appears under its name, it is loaded by its runtime (ONNX Runtime's CPU provider,
`torch.jit.load`) and run on batches of real text of several sizes and lengths, with padding; its
outputs must equal the eager model's within `MAX_ABS_DIFF`, at every position, padding included.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bert.checkpoint import Checkpoint
from bert.config import BertConfig
from bert.errors import InputError
from bert.extract_features import demo_file
from bert.flags import EXPORT_FORMATS as FORMATS
from bert.loading import load_model
from bert.modeling import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertModel,
    BertPreTrainedModel,
)
from bert.quantization import quantize_int8
from bert.tokenization import FullTokenizer
from bert.utils import atomic_write

logger = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAMES = {
    "BertModel": ("last_hidden_state", "pooler_output"),
    "BertForPreTraining": ("prediction_logits", "seq_relationship_logits"),
    "BertForSequenceClassification": ("logits",),
    "BertForTokenClassification": ("logits",),
    "BertForQuestionAnswering": ("start_logits", "end_logits"),
    "BertForMultipleChoice": ("logits",),
}
ONNX_OPSET = 18
# Largest difference allowed between an fp32 graph and the eager model: float reassociation only.
MAX_ABS_DIFF = 1e-4
# Largest relative error allowed for an int8 ONNX graph against the fp32 model, |int8 - fp32| / |fp32| per
# output at real tokens: int8 moves all-MiniLM-L6-v2's hidden states by 15% (its mean-pooled embeddings by
# 1%: cosine 0.99), a broken graph moves them by 100% or more.
MAX_INT8_RELATIVE_ERROR = 0.35
# Files of the model directory that make the exported file usable alone (tokenizer, labels, pooling).
SIDECAR_FILES = ("vocab.txt", "tokenizer_config.json", "modules.json", "sentence_bert_config.json")
SIDECAR_DIRS = ("1_Pooling",)


class ExportGraph(nn.Module):
    """A model as a graph: the three id tensors in, a tuple of plain tensors (`output_names`) out."""

    model: BertPreTrainedModel

    def __init__(self, model: BertPreTrainedModel):
        super().__init__()
        self.model = model
        names = OUTPUT_NAMES[type(model).__name__]
        if isinstance(model, BertModel) and model.pooler is None:
            names = names[:1]
        self.output_names = names

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, attention_mask, token_type_ids)
        if isinstance(self.model, BertModel):
            return (out.sequence_output,) if out.pooled_output is None else (out.sequence_output, out.pooled_output)
        if isinstance(self.model, BertForPreTraining):
            return out.mlm_logits, out.nsp_logits
        if isinstance(self.model, BertForQuestionAnswering):
            return tuple(out.logits.unbind(-1))  # [B, T, 2] -> start [B, T], end [B, T]
        return (out.logits,)


# ---------------------------------------------------------------------------------------- the inputs
def _shape(model: BertPreTrainedModel, batch: int, choices: int, seq_len: int) -> tuple[int, ...]:
    return (batch, choices, seq_len) if isinstance(model, BertForMultipleChoice) else (batch, seq_len)


def check_batches(
    model: BertPreTrainedModel, tokenizer: FullTokenizer | None, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """Padded batches of three sizes and lengths: rows of real text (the built-in demo sentences) when the
    model has a vocab, random ids otherwise; every row but the first of a batch is shorter, so padded."""
    config = model.config
    max_len = min(128, config.max_position_embeddings)
    generator = torch.Generator().manual_seed(seed)
    stream, special = _id_stream(config, tokenizer, max_len, generator)
    batches = []
    for batch, choices, seq_len in ((1, 2, min(5, max_len)), (3, 3, min(17, max_len)), (8, 4, max_len)):
        rows = batch * (choices if isinstance(model, BertForMultipleChoice) else 1)
        ids = torch.zeros(rows, seq_len, dtype=torch.long)
        mask = torch.zeros_like(ids)
        types = torch.zeros_like(ids)
        for r in range(rows):
            n = max(2, seq_len - r * (seq_len - 2) // rows)
            start = int(torch.randint(0, len(stream) - n + 1, (1,), generator=generator))
            ids[r, :n] = stream[start : start + n]
            if special is not None:
                ids[r, 0], ids[r, n - 1] = special
            mask[r, :n] = 1
            if config.type_vocab_size > 1:
                types[r, n // 2 : n] = 1  # a sentence pair: segment B is the second half
        shape = _shape(model, batch, choices, seq_len)
        batches.append(
            {"input_ids": ids.view(shape), "attention_mask": mask.view(shape), "token_type_ids": types.view(shape)}
        )
    return batches


def _id_stream(
    config: BertConfig, tokenizer: FullTokenizer | None, max_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, tuple[int, int] | None]:
    """The ids the check batches are cut from, at least `max_len` of them (the demo sentences' pieces, else
    random ids), and the ([CLS], [SEP]) ids that frame each row (None for random ids)."""
    if tokenizer is None:
        return torch.randint(0, config.vocab_size, (max_len,), generator=generator), None
    with open(demo_file("input.txt"), encoding="utf-8") as f:
        text = " ".join(line.replace("|||", " ") for line in f)
    pieces = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))
    cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    return torch.tensor(pieces * (max_len // max(len(pieces), 1) + 1)), (cls_id, sep_id)


def _example(model: BertPreTrainedModel) -> tuple[torch.Tensor, ...]:
    """The traced example: 2 x (2 x) 8, sizes no check batch has, and none of them 1 (torch.export would fix
    an axis of size 1 to that size)."""
    shape = _shape(model, 2, 2, min(8, model.config.max_position_embeddings))
    ids = torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids), torch.zeros_like(ids)


# ------------------------------------------------------------------------------------------ exporters
@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' and the quantizer's progress messages (they log at INFO, some to the root
    logger) and their deprecation warnings: a successful export is reported once, by us."""
    names = ("", "torch.onnx", "torch.export", "onnxscript", "onnx_ir", "torch._dynamo")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def require_onnx() -> None:
    """Raise InputError with the install command when the `onnx` extra is missing."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise InputError(
            f'--format=onnx needs the onnx extra ({e.name} is missing): pip install "bert[onnx]"'
        ) from None


def export_onnx(graph: ExportGraph, path: Path) -> None:
    example = _example(graph.model)
    batch = torch.export.Dim("batch_size")
    seq = torch.export.Dim("sequence_length", max=graph.model.config.max_position_embeddings)
    if isinstance(graph.model, BertForMultipleChoice):
        axes = {0: batch, 1: torch.export.Dim("num_choices"), 2: seq}
    else:
        axes = {0: batch, 1: seq}
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            graph,
            example,
            input_names=list(INPUT_NAMES),
            output_names=list(graph.output_names),
            dynamic_shapes={name: axes for name in INPUT_NAMES},
            opset_version=ONNX_OPSET,
            dynamo=True,
            verbose=False,
        )
        assert program is not None  # dynamo=True returns the program
        # One file: protobuf's 2 GB limit is above BERT-Large's 1.3 GB.
        program.save(str(path), external_data=False)


def quantize_onnx(src: Path, dst: Path) -> None:
    """ONNX Runtime's dynamic int8 quantization of the MatMul/Gemm weights (activations quantized at run time)."""
    # The onnx extra is optional: imported only when it is used.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet():
        # 7-bit weights (reduce_range): CPUs without VNNI multiply uint8 x int8 with VPMADDUBSW, whose int16
        # sums saturate with full-range weights (measured: the pooler output 25% off on a random model).
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)


def optimize_onnx(src: Path, dst: Path, config: BertConfig) -> None:
    """ONNX Runtime's transformer optimizer for BERT (`onnxruntime.transformers.optimizer`): fuses the
    LayerNorms with their residual adds (SkipLayerNormalization), bias with GELU, and attention where it
    recognises the pattern; the graph then needs ONNX Runtime's contrib operators (its CPU provider has them)."""
    # The onnx extra is optional: imported only when it is used.
    from onnxruntime.transformers.optimizer import optimize_model

    with _quiet():
        optimized = optimize_model(
            str(src), model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size
        )
        optimized.save_model_to_file(str(dst))


def export_torchscript(graph: ExportGraph, path: Path) -> None:
    # torch.jit.trace is deprecated in favour of torch.export, but TorchScript files are what C++
    # (libtorch) and older serving stacks load; the check below proves the trace is right at other shapes.
    with _quiet(), torch.no_grad():
        traced = torch.jit.trace(graph, _example(graph.model))
        traced.save(str(path))


def _onnx_runner(path: Path) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    import onnxruntime  # the optional onnx extra, imported only when it is used

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda inputs: session.run(None, inputs)


def _torchscript_runner(path: Path) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    with _quiet():
        module = torch.jit.load(str(path), map_location="cpu")

    def run(inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            return [o.numpy() for o in module(*(torch.from_numpy(inputs[n]) for n in INPUT_NAMES))]

    return run


# format -> function(path) returning a function from named numpy inputs to the list of outputs.
RUNNERS: dict[str, Callable[[Path], Callable[[dict[str, np.ndarray]], list[np.ndarray]]]] = {
    "onnx": _onnx_runner,
    "torchscript": _torchscript_runner,
}


# ---------------------------------------------------------------------------------------------- check
@dataclass
class CheckResult:
    max_abs_diff: float  # over every output, position and check batch, padded positions included
    max_relative_error: float  # |exported - eager| / |eager| (2-norms at real tokens), worst output and batch
    shapes: list[tuple[int, ...]]  # the input shapes checked


def compare(graph: ExportGraph, run: Callable, batches: list[dict[str, torch.Tensor]]) -> CheckResult:
    """Run the exported file and the eager graph on `batches`; a missing or misshapen output counts as inf."""
    diff = rel = 0.0
    shapes = [tuple(b["input_ids"].shape) for b in batches]
    for batch in batches:
        with torch.no_grad():
            expected = [t.numpy() for t in graph(**batch)]
        got = run({k: v.numpy() for k, v in batch.items()})
        if len(got) != len(expected) or any(np.shape(g) != e.shape for g, e in zip(got, expected)):
            return CheckResult(float("inf"), float("inf"), shapes)
        real = batch["attention_mask"].bool().numpy()
        for g, e in zip(got, expected):
            g = g.astype(np.float64)
            diff = max(diff, float(np.abs(g - e).max()))
            if e.shape[: real.ndim] == real.shape:  # per-token output: padded positions hold unused values
                g, e = g[real], e[real]
            rel = max(rel, float(np.linalg.norm(g - e) / max(float(np.linalg.norm(e)), 1e-12)))
    if not np.isfinite(diff) or not np.isfinite(rel):
        diff = rel = float("inf")
    return CheckResult(diff, rel, shapes)


def _tokenizer(ckpt: Checkpoint) -> FullTokenizer | None:
    if ckpt.vocab_file is None:
        return None
    return FullTokenizer(ckpt.vocab_file, do_lower_case=bool(ckpt.tokenizer_settings.get("do_lower_case", True)))


def output_path(output: str | os.PathLike, fmt: str) -> Path:
    """`--output` as a file: a directory (existing, or written with a trailing slash) gets the format's file name."""
    out = Path(output)
    if out.is_dir() or str(output).endswith(("/", os.sep)):
        return out / FORMATS[fmt]
    return out


def export(
    model_dir: str | os.PathLike, fmt: str, output: str | os.PathLike, quantize: str = "none", optimize: bool = False
) -> dict:
    """Export `model_dir` as `fmt` ("onnx" or "torchscript") to `output`, check it, copy the tokenizer files beside.

    `optimize=True` (ONNX only) rewrites the graph with ONNX Runtime's transformer optimizer
    (`optimize_onnx`) and checks the result against the eager model within `MAX_ABS_DIFF` again.

    `quantize="int8"` writes an int8 graph: for TorchScript the model quantized by
    `bert.quantization.quantize_int8` (checked against that eager model within `MAX_ABS_DIFF`), for ONNX
    the fp32 graph (checked as usual) quantized by ONNX Runtime (checked against the fp32 model within
    `MAX_INT8_RELATIVE_ERROR`).

    Returns:
        {"output", "format", "architecture", "outputs", "max_abs_diff", "max_relative_error", "checked_shapes"}.

    Raises:
        InputError: an unreadable model, a missing onnx extra, or an exported graph that fails the check
            (nothing is written then).
    """
    if fmt not in FORMATS:
        raise InputError(f"--format={fmt} is unknown; use one of {', '.join(FORMATS)}")
    if quantize not in ("none", "int8"):
        raise InputError(f"--quantize={quantize} is unknown; use none or int8")
    if optimize and fmt != "onnx":
        raise InputError("--optimize applies ONNX Runtime's optimizer to ONNX graphs; use --format=onnx or drop it")
    if fmt == "onnx":
        require_onnx()
    model, ckpt = load_model(model_dir, OUTPUT_NAMES, "export supports")
    model.set_unpad(False)
    if quantize == "int8" and fmt == "torchscript":
        quantize_int8(model, bf16_products=False)
    graph = ExportGraph(model).eval()
    batches = check_batches(model, _tokenizer(ckpt))
    out = output_path(output, fmt)
    result = _write_checked(graph, fmt, out, batches, optimize, quantize == "int8" and fmt == "onnx")
    _write_sidecars(model, ckpt, out.parent)
    name = type(model).__name__
    logger.info(
        "wrote %s (%s %s%s%s, outputs %s); checked against the eager model on inputs %s: max abs difference %.2e",
        out,
        name,
        fmt,
        " optimized" if optimize else "",
        " int8" if quantize == "int8" else "",
        ", ".join(graph.output_names),
        ", ".join("x".join(map(str, s)) for s in result.shapes),
        result.max_abs_diff,
    )
    return {
        "output": str(out),
        "format": fmt,
        "quantize": quantize,
        "optimize": optimize,
        "architecture": name,
        "outputs": list(graph.output_names),
        "max_abs_diff": result.max_abs_diff,
        "max_relative_error": result.max_relative_error,
        "checked_shapes": result.shapes,
    }


def _write_checked(
    graph: ExportGraph, fmt: str, out: Path, batches: list[dict[str, torch.Tensor]], optimize: bool, int8_onnx: bool
) -> CheckResult:
    """Write `graph` as `fmt` to `out` through a temporary file, checked after each stage (the export, ONNX
    Runtime's optimizer, its int8 quantization); the last stage's check."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # A killed run leaves `.NAME.tmp-XXXXXXXX`, a name `bert.outputs.claim` removes on the next run.
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp = tmp_dir / out.name
        (export_onnx if fmt == "onnx" else export_torchscript)(graph, tmp)
        result = _check_exported(graph, RUNNERS[fmt](tmp), batches, out, "")
        if optimize:
            optimize_onnx(tmp, tmp_dir / "optimized.onnx", graph.model.config)
            os.replace(tmp_dir / "optimized.onnx", tmp)
            result = _check_exported(graph, RUNNERS[fmt](tmp), batches, out, "optimized")
        if int8_onnx:
            quantize_onnx(tmp, tmp_dir / "int8.onnx")
            os.replace(tmp_dir / "int8.onnx", tmp)
            result = _check_exported(graph, RUNNERS[fmt](tmp), batches, out, "int8")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return result


def _check_exported(
    graph: ExportGraph, run: Callable, batches: list[dict[str, torch.Tensor]], out: Path, stage: str
) -> CheckResult:
    """`compare` the exported file (`run`) with the eager model after each `stage` of the export ("", then
    "optimized" and "int8"): every output within MAX_ABS_DIFF, the int8 graph's within
    MAX_INT8_RELATIVE_ERROR, else an error naming `out`, which is then not written."""
    result = compare(graph, run, batches)
    if stage == "int8":
        ok = result.max_relative_error <= MAX_INT8_RELATIVE_ERROR
        what = f"int8 relative error {result.max_relative_error:.3g} > {MAX_INT8_RELATIVE_ERROR}"
    else:
        ok = result.max_abs_diff <= MAX_ABS_DIFF
        what = (f"{stage}: " if stage else "") + f"max abs difference {result.max_abs_diff:.3g} > {MAX_ABS_DIFF:g}"
    if not ok:
        raise InputError(
            f"{out}: the exported graph does not match the eager model on inputs "
            f"{', '.join('x'.join(map(str, s)) for s in result.shapes)} ({what}); nothing was written. "
            "This is a bug in the exporter or the runtime: report it with the model's config.json"
        )
    return result


def _write_sidecars(model: BertPreTrainedModel, ckpt: Checkpoint, out_dir: Path) -> None:
    """config.json (naming the exported architecture) and the model directory's tokenizer and pooling files."""
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    with atomic_write(out_dir / "config.json") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    src = Path(ckpt.source) if Path(ckpt.source).is_dir() else Path(ckpt.source).parent
    if src.resolve() == out_dir.resolve():
        return
    for name in SIDECAR_FILES:
        if (src / name).is_file():
            with atomic_write(out_dir / name, "wb") as f, open(src / name, "rb") as s:
                shutil.copyfileobj(s, f)
    for name in SIDECAR_DIRS:
        if (src / name).is_dir():
            shutil.copytree(src / name, out_dir / name, dirs_exist_ok=True)
    if not (out_dir / "vocab.txt").is_file():
        logger.warning("%s has no vocab.txt: copy the model's vocabulary beside %s to tokenize for it", src, out_dir)
