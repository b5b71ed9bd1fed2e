"""`bert export`: a model directory -> one ONNX or TorchScript file, checked against the eager model."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from bert.flags import EXPORT_FORMATS, QUANTIZE_CHOICES
from bert.outputs import claim
from bert.utils import atomic_write, print_result


@dataclass
class ExportArgs:
    """Export a model to ONNX or TorchScript for serving: inputs input_ids, attention_mask, token_type_ids
    (batch and sequence axes dynamic), transformers' output names. The file is checked against the eager
    model on padded batches of several shapes before it is written; config.json, vocab.txt and
    tokenizer_config.json are copied beside it."""

    model: str = field(
        metadata={
            "model": True,
            "help": "Model directory (native or transformers layout); the head is config.json's architectures[0].",
        }
    )
    output: str = field(
        metadata={"help": "File to write; a directory (existing, or ending in /) gets model.onnx or model.pt inside."}
    )
    format: str = field(default="onnx", metadata={"help": "Exported format.", "choices": list(EXPORT_FORMATS)})
    quantize: str = field(
        default="none",
        metadata={
            "help": "int8: dynamic int8 quantization of the Linear layers for CPU inference (ONNX: ONNX Runtime's "
            "quantizer; TorchScript: torch's).",
            "choices": list(QUANTIZE_CHOICES),
        },
    )
    optimize: bool = field(
        default=False,
        metadata={
            "help": "ONNX: rewrite the graph with ONNX Runtime's transformer optimizer (fused LayerNorm + residual, "
            "bias + GELU; applied before --quantize) and check it against the eager model again. The file then "
            "needs ONNX Runtime."
        },
    )


def run_export(args: ExportArgs) -> dict:
    """Export, check and write; returns what `bert.export.export` returns. Records the args and the check's
    result in OUTPUT.args.json."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.export import SIDECAR_FILES, output_path

    out = output_path(args.output, args.format)
    # The files written beside the export are outputs too: exporting into the model's own directory would
    # replace its config.json and tokenizer files.
    beside = [out.parent / name for name in ("config.json", *SIDECAR_FILES)]
    files = {"--output": [out, *beside]}
    with claim("export", files=files, inputs={"--model": args.model}, derived={"--output": [".args.json"]}):
        return _export(args)


def _export(args: ExportArgs) -> dict:
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    from bert.export import export

    result = export(args.model, args.format, args.output, quantize=args.quantize, optimize=args.optimize)
    with atomic_write(result["output"] + ".args.json") as f:
        json.dump({"command": "export", "args": asdict(args), "result": result}, f, indent=2)
        f.write("\n")
    shapes = len(result["checked_shapes"])
    print_result(
        "export",
        f"{result['architecture']} -> {result['output']} ({args.format}, quantize {args.quantize})",
        f"checked against the eager model on {shapes} batch shapes: max abs difference {result['max_abs_diff']:.2e}",
    )
    return result
