"""The model card (`README.md`) of a model a training command exports: the Hugging Face Hub's metadata block
(base model, library, pipeline tag, tags, datasets, metrics), then what it was trained from, on what, with
which command line, its evaluation figures and how to load it, so `hf upload` publishes the directory as it is.

`write_model_card` is called once per run, by `run_dir.finish_run`, after the final evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bert.errors import InputError
from bert.grid import command_line
from bert.hub import hub_id_of
from bert.utils import atomic_write

if TYPE_CHECKING:
    from bert.flags import TrainingArgs

CARD_NAME = "README.md"
# What each command's model is, in the Hub's terms: (pipeline tag, library that loads it).
_KINDS = {
    "train-embeddings": ("sentence-similarity", "sentence-transformers"),
    "train-reranker": ("text-ranking", "sentence-transformers"),
    "classify": ("text-classification", "transformers"),
    "ner": ("token-classification", "transformers"),
    "squad": ("question-answering", "transformers"),
    "swag": ("multiple-choice", "transformers"),
    "pretrain": ("fill-mask", "transformers"),
}
# `bert classify --task_name`'s data sets by their Hub ids (the other commands read files of any origin).
_GLUE_TASKS = {"cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst-2", "sts-b", "wnli"}


def _base_model(args: TrainingArgs) -> tuple[str | None, str | None]:
    """(Hub id or None, what the card names) of the model the run started from."""
    start = getattr(args, "init_checkpoint", None)
    if start is None:
        return None, None
    found = hub_id_of(start)
    return (found[0], found[0]) if found else (None, os.path.basename(os.path.normpath(start)) or start)


def _dataset(command: str, args: TrainingArgs) -> tuple[str | None, str]:
    """(Hub id or None, what the card names) of the training data."""
    task = str(getattr(args, "task_name", "") or "").lower() if command == "classify" else ""
    if task in _GLUE_TASKS:
        return "nyu-mll/glue", f"GLUE {task.upper()}"
    if task == "xnli":
        return "facebook/xnli", "XNLI"
    local = getattr(args, "train_file", None) or getattr(args, "data_dir", None) or getattr(args, "input_file", None)
    return None, f"`{os.path.basename(os.path.normpath(str(local)))}`" if local else "its training data"


def _yaml(value: Any) -> str:
    return json.dumps(value)  # a JSON scalar or list is YAML too, quoted where YAML would misread it


def _command(command: str, args: TrainingArgs) -> str:
    try:
        flags = command_line(args)
    except InputError:  # a flag set in Python to what no command line gives: the flags as recorded
        flags = [f"--{k}={v}" for k, v in sorted(dataclasses.asdict(args).items()) if v is not None]
    return " \\\n  ".join([f"bert {command}", *flags])


def _usage(command: str) -> str:
    if command == "train-embeddings":
        return (
            "```bash\nbert embed --model=PATH --input_file=sentences.txt --output_file=vectors.npy\n```\n\n"
            "```python\nfrom sentence_transformers import SentenceTransformer\n\n"
            'vectors = SentenceTransformer("PATH").encode(["A sentence.", "Another one."])\n```\n'
        )
    if command == "train-reranker":
        return (
            "```bash\nbert rerank --model=PATH --input_file=queries_and_documents.jsonl\n```\n\n"
            "```python\nfrom sentence_transformers import CrossEncoder\n\n"
            'scores = CrossEncoder("PATH").predict([("a query", "a document")])\n```\n'
        )
    auto = {
        "classify": "AutoModelForSequenceClassification",
        "ner": "AutoModelForTokenClassification",
        "squad": "AutoModelForQuestionAnswering",
        "swag": "AutoModelForMultipleChoice",
        "pretrain": "AutoModelForMaskedLM",
    }.get(command, "AutoModel")
    run = "fill-mask" if command == "pretrain" else "predict"
    return (
        f"```bash\nbert {run} --model=PATH --input_file=inputs.txt\n```\n\n"
        f"```python\nfrom transformers import AutoTokenizer, {auto}\n\n"
        f'model = {auto}.from_pretrained("PATH")\ntokenizer = AutoTokenizer.from_pretrained("PATH")\n```\n'
    )


def write_model_card(
    model_dir: str | os.PathLike, command: str, args: TrainingArgs, results: dict[str, Any] | None
) -> Path:
    """Write `model_dir/README.md` for the model `bert COMMAND` trained with `args` (its Args dataclass),
    evaluated to `results` (the run's final `eval_results`, None without an evaluation)."""
    path = Path(model_dir) / CARD_NAME
    pipeline_tag, library = _KINDS.get(command, (None, "transformers"))
    base_id, base_name = _base_model(args)
    dataset_id, dataset_name = _dataset(command, args)
    figures = {
        k: v
        for k, v in (results or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    meta: list[str] = []
    if base_id:
        meta.append(f"base_model: {_yaml(base_id)}")
    meta.append(f"library_name: {library}")
    if pipeline_tag:
        meta.append(f"pipeline_tag: {pipeline_tag}")
    meta.append("tags:\n" + "".join(f"- {t}\n" for t in ("bert", command, "bert-pytorch")).rstrip("\n"))
    if dataset_id:
        meta.append(f"datasets:\n- {_yaml(dataset_id)}")
    metrics = [k.removeprefix("eval_") for k in figures if k not in ("global_step", "eval_loss", "loss")]
    if metrics:
        meta.append("metrics:\n" + "\n".join(f"- {_yaml(m)}" for m in metrics))
    lines = ["---", *meta, "---", "", f"# {Path(model_dir).resolve().parent.name}", ""]
    trained = f"Trained with `bert {command}`"
    trained += f" from {f'[{base_id}](https://huggingface.co/{base_id})' if base_id else f'`{base_name}`'}"
    lines += [f"{trained} on {dataset_name}.", ""]
    for name in ("loss", "teacher"):
        value = getattr(args, name, None)
        if value is not None:
            found = hub_id_of(str(value)) if name == "teacher" else None
            lines += [f"- {name}: `{found[0] if found else value}`"]
    if lines[-1]:
        lines.append("")
    lines += ["## Command", "", "```bash", _command(command, args), "```", "", "## Evaluation", ""]
    if figures:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in figures.items()]
    else:
        lines += ["Not evaluated (run with --do_eval)."]
    lines += ["", "## Usage", "", "PATH is this directory (or its Hub id once uploaded).", "", _usage(command)]
    with atomic_write(path) as f:
        f.write("\n".join(lines))
    return path
