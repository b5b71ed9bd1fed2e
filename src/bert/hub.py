"""Models named by their Hugging Face Hub id (`org/name`, `org/name@revision`), found in the Hugging Face cache.

Every flag that names a model is marked `"model": True` in its field's metadata; `resolve_model_flags` turns
such a value into the directory it names before the command runs, so the readers (`checkpoint.read_checkpoint`,
`inference.Predictor`, the starting model, the teachers) only ever see directories. A local path of that name
wins; an id is looked up in the cache as `huggingface_hub` lays it out (`HF_HUB_CACHE`, else
`HF_HOME/hub`: `models--org--name/snapshots/<commit>`, `refs/<revision>`) and downloaded when the network allows
it and `HF_HUB_OFFLINE` is not set. `huggingface_hub` is the optional extra `hub`, imported only for an id.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, TypeVar

from bert.errors import InputError

# The Hub's repository names: letters, digits, '-', '_' and '.', one '/' between owner and name; a revision
# (branch, tag, commit, "refs/pr/1") after '@'.
_HUB_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<rev>[A-Za-z0-9._/-]+))?$"
)
# What this project reads of a model repository (weights, configs, vocabulary, sentence-transformers modules);
# repositories also hold TF, ONNX, OpenVINO and PyTorch-pickle copies of the same weights.
ALLOW_PATTERNS = ["*.json", "*.txt", "*.safetensors"]

A = TypeVar("A")


def hub_cache_dir() -> Path:
    """The cache `huggingface_hub` reads and fills, by its own environment variables."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def parse_hub_id(value: str) -> tuple[str, str | None] | None:
    """(repository, revision) when `value` is a Hub id and no local path: neither `value` nor the directory of
    its first part exists here (a TF prefix such as `model/bert_model.ckpt` names a file that does not)."""
    match = _HUB_ID.match(value)
    if match is None or Path(value).exists() or Path(match["repo"].split("/")[0]).exists():
        return None
    return match["repo"], match["rev"]


def resolve_model(value: str, flag: str) -> str:
    """The local directory of `value`: itself when it is no Hub id, else its snapshot in the cache."""
    parsed = parse_hub_id(value)
    if parsed is None:
        return value
    repo, revision = parsed
    cache = hub_cache_dir()
    fetch = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
    miss = f"{flag}={value}: no such local path, and the Hugging Face cache {cache} has no {repo}" + (
        f" at {revision}" if revision else ""
    )
    try:
        import huggingface_hub  # the optional extra `hub`: only a Hub id needs it
    except ImportError:
        raise InputError(f"{miss} readable without huggingface_hub; pip install 'bert[hub]', then {fetch}") from None
    # Read from the environment now: huggingface_hub reads it once, when it is first imported.
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    try:
        path = huggingface_hub.snapshot_download(
            repo, revision=revision, cache_dir=cache, allow_patterns=ALLOW_PATTERNS, local_files_only=offline
        )
    except Exception as e:  # offline misses, unknown repositories or revisions, network failures: one line
        offline_note = " (HF_HUB_OFFLINE is set)" if offline else ""
        raise InputError(f"{miss}{offline_note}: {type(e).__name__}; fetch it with {fetch}") from None
    return str(path)


def hub_id_of(path: str) -> tuple[str, str] | None:
    """(repository id, commit) of a snapshot directory of the cache, for `bert serve`'s /info."""
    p = Path(path).resolve(strict=False)
    if p.parent.name != "snapshots" or not p.parent.parent.name.startswith("models--"):
        return None
    return p.parent.parent.name.removeprefix("models--").replace("--", "/", 1), p.name


def resolve_model_flags(args: A) -> A:
    """`args` with every model flag (metadata `"model": True`) that names a Hub id replaced by its directory."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(args):  # type: ignore[arg-type]
        value = getattr(args, f.name)
        if f.metadata.get("model") and isinstance(value, str):
            resolved = resolve_model(value, "--" + f.name)
            if resolved != value:
                changes[f.name] = resolved
    return dataclasses.replace(args, **changes) if changes else args  # type: ignore[type-var]
