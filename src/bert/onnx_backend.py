"""An exported ONNX file (`bert export`) run by ONNX Runtime in place of the torch model, for `Predictor`
(`Predictor.from_pretrained(path, backend="onnx")`).

`path` is the directory `bert export` wrote (`model.onnx` with `config.json`, `vocab.txt` and the
tokenizer and sentence-transformers files beside it) or the `.onnx` file itself. `OnnxModel` answers
the calls `Predictor` makes of a model, with the same outputs (`EncoderOutput.sequence_output` and
`pooled_output`, `PreTrainingOutput.mlm_logits`, `TaskOutput.logits`), so every task runs unchanged; the
graph has the head's outputs only, so a head's model offers its task and not `embed` (a `BertForPreTraining`
graph offers fill-mask).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bert.checkpoint import Checkpoint, read_beside
from bert.checkpoint import architecture as checkpoint_architecture
from bert.config import BertConfig
from bert.errors import InputError
from bert.export import FORMATS, INPUT_NAMES, OUTPUT_NAMES
from bert.modeling import EncoderOutput, PreTrainingOutput, TaskOutput


def onnx_file(path: str | os.PathLike) -> Path:
    """The `.onnx` file `path` names: the file itself, or `model.onnx` in a directory."""
    p = Path(path)
    if p.is_dir():
        p = p / FORMATS["onnx"]
        if not p.is_file():
            # A model directory (weights, not an export): name the file and the command that writes it.
            out = f"{str(path).rstrip('/')}_onnx"
            raise InputError(
                f"{p}: no such file (backend onnx runs the file `bert export` writes); write it with `bert export "
                f"--model={path} --output={out}/` and load {out}"
            )
    if not p.is_file() or p.suffix != ".onnx":
        raise InputError(
            f"{path}: no ONNX model there; pass a directory written by `bert export --format=onnx` or its .onnx file"
        )
    return p


def session(path: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session on `path` with `threads` intra-op threads that do not spin."""
    try:
        import onnxruntime  # the optional onnx extra, imported only when used
    except ImportError:
        # Running a file needs ONNX Runtime alone (exporting one needs the whole extra).
        raise InputError(
            f'{path}: backend onnx needs ONNX Runtime: pip install onnxruntime (or "bert[onnx]")'
        ) from None

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    # ONNX Runtime's threads spin between operators as OpenMP's do by default, with no bound to set; for the
    # reason of the package's OpenMP default (bert/__init__.py) they sleep instead, keeping a fair share of a
    # busy machine (on an idle one this cost nothing measurable: bench/RESULTS.md).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxModel(nn.Module):
    """An exported graph behind the model interface `Predictor` uses: `model(ids, mask, types)`, `.config`,
    `.num_labels`, and `.bert` / `.pooler` for the encoder of a `BertModel` export."""

    def __init__(self, path: Path, config: BertConfig, architecture: str, threads: int):
        super().__init__()
        self.config = config
        self.architecture = architecture
        self.source = str(path)
        self.session = session(path, threads)
        self.output_names = [o.name for o in self.session.get_outputs()]
        missing = [n for n in INPUT_NAMES if n not in {i.name for i in self.session.get_inputs()}]
        if missing or self.output_names[0] != OUTPUT_NAMES[architecture][0]:
            raise InputError(
                f"{path}: the graph's inputs and outputs are not those `bert export` writes for {architecture} "
                f"(outputs {', '.join(self.output_names)}); export the model with `bert export`"
            )
        # The head's width, for the label list: the graph's last output axis (fixed by the weights).
        width = self.session.get_outputs()[0].shape[-1]
        self.num_labels = width if isinstance(width, int) else len(config.extra.get("id2label") or {}) or 2
        # Predictor reads the encoder of a model as `model.bert` (a BertModel is its own encoder) and whether
        # it has a pooler as `encoder.pooler`.
        self.pooler = True if "pooler_output" in self.output_names else None
        # A pre-training graph's prediction_logits are the masked-LM head's, for fill-mask.
        self.has_mlm_head = architecture == "BertForPreTraining"

    @property
    def bert(self) -> OnnxModel | _NoEncoder:
        return self if self.architecture == "BertModel" else _NoEncoder(self.source, self.architecture)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> Any:
        feed = {
            name: t.to(torch.int64).cpu().numpy()
            for name, t in zip(INPUT_NAMES, (input_ids, attention_mask, token_type_ids))
        }
        out = dict(zip(self.output_names, (torch.from_numpy(np.asarray(o)) for o in self.session.run(None, feed))))
        if self.architecture == "BertModel":
            hidden = out["last_hidden_state"]
            return EncoderOutput(hidden, out.get("pooler_output"), [hidden], hidden)
        if self.architecture == "BertForPreTraining":
            return PreTrainingOutput(out["prediction_logits"], out["seq_relationship_logits"])  # [B, T, V], [B, 2]
        if self.architecture == "BertForQuestionAnswering":
            return TaskOutput(torch.stack([out["start_logits"], out["end_logits"]], dim=-1))  # [B, T, 2]
        return TaskOutput(out["logits"])


class _NoEncoder:
    """The encoder of a head's graph, which has the head's outputs only: calling it is an error."""

    pooler = None

    def __init__(self, source: str, architecture: str):
        self.source, self.architecture = source, architecture

    def __call__(self, *args: Any) -> Any:
        raise InputError(
            f"{self.source} is a {self.architecture} graph with the head's outputs only; embed with the torch "
            "backend, or export the encoder (a BertModel directory) and embed with that"
        )


def load(path: str | os.PathLike, threads: int) -> tuple[OnnxModel, Checkpoint]:
    """The graph at `path` and what `Predictor` needs beside it (config, vocab, tokenizer settings)."""
    file = onnx_file(path)
    ckpt = read_beside(file.parent, Checkpoint({}, str(path), "onnx"))
    if ckpt.config is None:
        raise InputError(f"{path}: no config.json beside {file.name}; export the model again with `bert export`")
    if ckpt.vocab_file is None:
        raise InputError(f"{path}: no vocab.txt beside {file.name}; copy the model's vocabulary there")
    architecture = checkpoint_architecture(ckpt, OUTPUT_NAMES, "`bert export` writes ONNX graphs of")
    return OnnxModel(file, ckpt.config, architecture, threads), ckpt
