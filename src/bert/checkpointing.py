"""A training run's state on disk and in the RNGs: checkpoints written, listed, verified and read back.

A checkpoint is `output_dir/checkpoint-<step>/`, written into a temporary directory and renamed (so only
complete ones are ever listed), holding the weights in the native layout (`bert.checkpoint.save_pretrained`)
with the vocabulary, `training_state.pt` (optimizer, scheduler, scaler, step, every rank's RNG states and
the task's data position; readable with `torch.load(weights_only=True)`) and `trainer_state.json` (a
summary with the SHA-256 of `training_state.pt`, checked when it is read back). `bert.training.Trainer`
gathers the state and calls `write_checkpoint`; the runners resume from `latest_checkpoint`. The export of
the final model (`export_model`) shares the weights' writer and refuses non-finite weights likewise.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch
from torch import nn

from bert.checkpoint import CONFIG_NAME, save_pretrained, write_vocab
from bert.config import SHAPE_FIELDS, BertConfig
from bert.errors import InputError, NonFiniteError
from bert.outputs import atomic_directory, remove_temporaries
from bert.utils import atomic_write, load_json_file

CHECKPOINT_PREFIX = "checkpoint-"
TRAINING_STATE_NAME = "training_state.pt"
TRAINER_STATE_NAME = "trainer_state.json"


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# -------------------------------------------------------------------------------------- RNG states
def get_rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states, as tensors, lists and numbers (loadable with weights_only)."""
    version, mt, gauss = random.getstate()
    # The legacy generator's state is this tuple (`legacy=True`, the default); the stubs also allow a dict.
    legacy = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    name, keys, pos, has_gauss, cached = legacy
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(mt), "gauss": gauss},
        "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss), "cached": cached},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_rng_state` returned."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


# -------------------------------------------------------------------------------------- checkpoints
def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints `checkpoint-<step>` in `output_dir`, oldest first.

    A checkpoint directory appears under its final name only when complete (it is renamed into place),
    so temporary `.checkpoint-*` directories of an interrupted save are never listed.
    """
    out: list[tuple[int, Path]] = []
    d = Path(output_dir)
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", p.name)
        if m and p.is_dir() and (p / TRAINING_STATE_NAME).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def remove_incomplete(output_dir: str | os.PathLike) -> None:
    """Delete the temporary files and directories of saves that a crash interrupted."""
    remove_temporaries(Path(output_dir))


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1][1] if ckpts else None


def check_checkpoint_config(checkpoint_dir: Path, config: BertConfig, flag: str = "--bert_config_file") -> None:
    """Refuse to resume a checkpoint whose model has another shape than `config`."""
    path = checkpoint_dir / CONFIG_NAME
    try:
        saved = BertConfig.from_json_file(path)
    except (OSError, ValueError, InputError) as e:
        raise InputError(f"{path}: cannot read the config of the checkpoint to resume ({e})") from None
    diffs = [
        f"{k} {getattr(saved, k)} (now {getattr(config, k)})"
        for k in SHAPE_FIELDS
        if getattr(saved, k) != getattr(config, k)
    ]
    if diffs:
        raise InputError(
            f"{path} holds a model of another shape: {', '.join(diffs)}; the output directory is resumed "
            f"from its newest checkpoint, so pass the {flag} it was trained with, or use a new --output_dir"
        )


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def load_training_state(checkpoint_dir: str | os.PathLike, verify: bool = True) -> dict[str, Any]:
    """Read `training_state.pt` with `weights_only=True` (it holds no pickled code).

    With `verify`, its SHA-256 must be the one saved beside it in `trainer_state.json` (torch checks no
    checksum: a flipped bit would be loaded silently).
    """
    path = Path(checkpoint_dir) / TRAINING_STATE_NAME
    state = load_json_file(Path(checkpoint_dir) / TRAINER_STATE_NAME, "checkpoint state", missing_ok=True)
    expected = (state or {}).get("training_state_sha256")
    if verify and expected is not None and path.is_file() and _file_sha256(path) != expected:
        raise InputError(
            f"{path} is damaged: it does not match the digest saved beside it in {TRAINER_STATE_NAME} (a flipped bit, "
            f"or a copy cut short); delete {Path(checkpoint_dir).name} to resume from an older checkpoint, or pass "
            "--ignore_checkpoint_digest to load it anyway"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file
        raise InputError(
            f"{path}: cannot read the training state ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"delete {Path(checkpoint_dir).name} to resume from an older checkpoint"
        ) from None


def check_finite_weights(state: dict[str, torch.Tensor], what: str) -> None:
    """Refuse to save weights that are not finite numbers: a run that diverged must not leave a NaN model."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteError(
                f"{what}: {name} holds NaN or inf values (the training diverged); nothing was saved. Lower "
                "--learning_rate, or resume from the last good checkpoint"
            )


def _save_torch(obj: Any, path: Path) -> str:
    """`torch.save` atomically; returns the SHA-256 of the bytes written. A full disk is an `OSError`
    naming `path` (torch reports it as a RuntimeError of its zip writer)."""

    class _Hashing:
        def __init__(self, f: Any):
            self.f, self.h = f, hashlib.sha256()

        def write(self, data: bytes) -> int:
            self.h.update(data)
            return self.f.write(data)

        def flush(self) -> None:
            self.f.flush()

    with atomic_write(path, "wb") as f:
        out = _Hashing(f)
        try:
            # torch.save calls only `write` and `flush`; its annotation asks for a whole binary file.
            torch.save(obj, cast(IO[bytes], out))
        except RuntimeError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, OSError):
                raise cause from None
            raise
    return out.h.hexdigest()


def export_model(
    model: nn.Module,
    path: str | os.PathLike,
    vocab: bytes | None = None,
    do_lower_case: bool | None = None,
    extra_files: dict[str, Any] | None = None,
) -> Path:
    """Write weights only (native layout, loadable with `from_pretrained`) to `path`, atomically, with the
    vocabulary `vocab` (its file's bytes) and `extra_files` ({relative path: JSON value}) beside them."""
    path = Path(path)
    check_finite_weights(model.state_dict(), f"the model to export to {path}")
    with atomic_directory(path) as tmp:
        _save_model(model, tmp, vocab, do_lower_case)
        for name, obj in (extra_files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def write_checkpoint(
    path: Path,
    model: nn.Module,
    state: dict[str, Any],
    summary: dict[str, Any],
    vocab: bytes | None,
    do_lower_case: bool | None,
) -> None:
    """Write the checkpoint directory `path` atomically: the model's files, `state` as `training_state.pt` and
    `summary` with that file's SHA-256 as `trainer_state.json`."""
    with atomic_directory(path) as tmp:
        _save_model(model, tmp, vocab, do_lower_case)
        digest = _save_torch(state, tmp / TRAINING_STATE_NAME)
        with atomic_write(tmp / TRAINER_STATE_NAME) as f:
            f.write(json.dumps({**summary, "training_state_sha256": digest}, indent=2, sort_keys=True) + "\n")


def _save_model(model: nn.Module, out: Path, vocab: bytes | None, do_lower_case: bool | None) -> None:
    """A checkpoint's or the export's model files: weights, config, tokenizer settings and vocabulary."""
    save_pretrained(model, out, do_lower_case=do_lower_case)
    if vocab is not None:
        write_vocab(out, vocab)


def prune_checkpoints(output_dir: Path, keep: int, protect: int | None) -> None:
    """Keep the `keep` newest checkpoints (all when 0) and the one of step `protect`."""

    if keep <= 0:
        return
    ckpts = list_checkpoints(output_dir)
    for step, path in ckpts[:-keep]:
        if step != protect:
            shutil.rmtree(path, ignore_errors=True)
