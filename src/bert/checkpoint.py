"""Reading and writing model checkpoints in every supported format.

Formats read (detected from what is on disk):
- native / transformers: a directory with `model.safetensors` or `pytorch_model.bin` and `config.json`
  (the two layouts coincide by design: our parameter names are transformers' names);
- original TensorFlow: `bert_model.ckpt.index` + `.data-*` (with `bert_config.json` beside it), read
  without TensorFlow by `bert.formats.tf_checkpoint`; optimizer slots and `global_step` are skipped.

Formats written: native (safetensors + config.json + vocab.txt + tokenizer_config.json), the
transformers layout, and a TF checkpoint with an original `bert_config.json`.
`.bin` files are loaded with `torch.load(weights_only=True)`, which never runs pickled code.

safetensors has no checksum, so the `model.safetensors` this module writes carry a SHA-256 of their
tensors in the file's metadata (`"sha256"`, see `tensors_digest`); reading one verifies it, so a flipped
bit or a copy cut short is an error naming the file instead of a model that silently differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from bert.config import BertConfig
from bert.errors import InputError
from bert.formats import tf_checkpoint
from bert.formats.keymaps import state_dict_to_tf_variables, tf_variables_to_state_dict
from bert.tokenization import FullTokenizer
from bert.utils import atomic_write, load_json_file

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
VOCAB_NAME = "vocab.txt"
# Keys a checkpoint may hold that are never parameters: transformers' position-id buffer, and the
# decoder bias that transformers ties to `cls.predictions.bias`.
_IGNORED_KEYS = ("bert.embeddings.position_ids", "embeddings.position_ids", "cls.predictions.decoder.bias")
# The MLM decoder weight is the word-embedding table; it is stored once, under the embedding's name.
TIED_KEY = "cls.predictions.decoder.weight"
# The safetensors metadata key of the tensors' digest.
DIGEST_KEY = "sha256"


@dataclass
class Checkpoint:
    """Weights under our names, plus what was found beside them."""

    state_dict: dict[str, torch.Tensor]
    source: str
    format: str  # "safetensors", "bin", "tf" or "onnx" (an exported graph: no state_dict)
    config: BertConfig | None = None
    vocab_file: str | None = None
    tokenizer_settings: dict = field(default_factory=dict)


def _normalise_key(key: str) -> str:
    # pytorch-pretrained-bert (the first PyTorch port) saved LayerNorm parameters as gamma/beta.
    if key.endswith(".gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith(".beta"):
        return key[: -len("beta")] + "bias"
    return key


def _find_beside(base: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        if (base / name).is_file():
            return base / name
    return None


def _read_tf(path: str) -> tuple[dict[str, torch.Tensor], Path]:
    prefix = tf_checkpoint.resolve_checkpoint_prefix(path)
    variables = tf_checkpoint.load_variables(prefix)
    state = tf_variables_to_state_dict(variables)
    if not state:
        raise InputError(f"TF checkpoint {prefix} holds no BERT weights (no bert/* or cls/* variables)")
    return {k: torch.from_numpy(np.array(v)) for k, v in state.items()}, Path(prefix).parent


def tensors_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order (independent of the file layout)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def _read_safetensors(path: Path, verify: bool = True) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise InputError(f"checkpoint {path} cannot be read ({e}); it is truncated or not a safetensors file") from None
    expected = metadata.get(DIGEST_KEY)
    if verify and expected is not None and tensors_digest(state) != expected:
        raise InputError(
            f"checkpoint {path} is damaged: its tensors do not match the digest saved with them (a flipped bit, or "
            "a copy cut short); restore it, delete it (a training run then resumes from an older checkpoint), or "
            "pass --ignore_checkpoint_digest to load it anyway"
        )
    return state


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    if path.stat().st_size == 0:
        raise InputError(f"checkpoint {path} cannot be read: it is empty (0 bytes, a copy cut short?); restore it")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for corrupt or unsafe pickles
        raise InputError(
            f"checkpoint {path} cannot be read safely ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}); "
            "convert it to safetensors with a trusted tool"
        ) from None
    if not isinstance(state, dict):
        raise InputError(f"checkpoint {path} does not hold a state dict")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise InputError(
                f"checkpoint {path}: {key!r} holds a {type(value).__name__}, not a tensor; it is not a model's "
                "state dict (a training state or another program's file?)"
            )
    return state


def _check_finite(state: Mapping[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Weights holding NaN or infinity give NaN for every input: refuse them naming the tensor."""
    for key, value in state.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise InputError(
                f"checkpoint {path}: {key} holds NaN or infinite values (a diverged run or a damaged file); use an "
                "earlier checkpoint"
            )


# (weight name, axis, config field): the config fields that the weights' shapes fix.
_SHAPES_ON_DISK = (
    ("embeddings.word_embeddings.weight", 0, "vocab_size"),
    ("embeddings.word_embeddings.weight", 1, "hidden_size"),
    ("embeddings.position_embeddings.weight", 0, "max_position_embeddings"),
    ("embeddings.token_type_embeddings.weight", 0, "type_vocab_size"),
    ("encoder.layer.0.intermediate.dense.weight", 0, "intermediate_size"),
)
_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")
# Task heads: (weight name, rows it must have: a number, or None for "at least one").
_HEADS = (("classifier.weight", None), ("qa_outputs.weight", 2))


def _weight(state: Mapping[str, torch.Tensor], name: str) -> tuple[str, torch.Tensor] | None:
    for key, value in state.items():
        if key == name or key.endswith("." + name):
            return key, value
    return None


def check_config_against_weights(
    config: BertConfig, state: Mapping[str, torch.Tensor], config_source: str, weights_source: str
) -> None:
    """The config's sizes must be those of the weights on disk, checked before a model of that config is
    built: a config saying `vocab_size: 1000000000` or `num_hidden_layers: 100000` would otherwise allocate
    it first. Task heads must have a sane shape (a classifier with at least one label)."""
    for name, axis, field_name in _SHAPES_ON_DISK:
        found = _weight(state, name)
        if found is None:
            continue
        key, value = found
        if value.dim() != 2:
            raise InputError(f"checkpoint {weights_source}: {key} has shape {tuple(value.shape)}; expected a matrix")
        want = getattr(config, field_name)
        if value.shape[axis] != want:
            raise InputError(
                f"{config_source}: {field_name}={want}, but {key} in {weights_source} has {value.shape[axis]}; set "
                f"{field_name} to {value.shape[axis]} (the config the weights were saved with)"
            )
    layers = {int(m.group(1)) for key in state if (m := _LAYER.search(key))}
    if layers and config.num_hidden_layers > max(layers) + 1:
        raise InputError(
            f"{config_source}: num_hidden_layers={config.num_hidden_layers}, but {weights_source} holds "
            f"{max(layers) + 1} layers; set num_hidden_layers to {max(layers) + 1}"
        )
    for name, rows in _HEADS:
        found = _weight(state, name)
        if found is None:
            continue
        key, value = found
        bias = state.get(key[: -len("weight")] + "bias")
        ok = value.dim() == 2 and value.shape[1] == config.hidden_size and (value.shape[0] == rows or rows is None)
        ok = ok and value.shape[0] >= 1 and (bias is None or tuple(bias.shape) == (value.shape[0],))
        if not ok:
            shapes = f"{tuple(value.shape)}" + (f" with a bias of {tuple(bias.shape)}" if bias is not None else "")
            wanted = f"({rows if rows else 'labels >= 1'}, hidden_size={config.hidden_size})"
            raise InputError(
                f"checkpoint {weights_source}: the head {key} has shape {shapes}, expected {wanted}; the file is "
                "damaged or not a model of this config"
            )


# tokenizer_config.json keys this project reads, with the types they may have.
_TOKENIZER_TYPES: dict[str, tuple[type, ...]] = {
    "do_lower_case": (bool, type(None)),
    "strip_accents": (bool, type(None)),
    "tokenize_chinese_chars": (bool, type(None)),
}


def _read_tokenizer_settings(path: Path) -> dict:
    settings = load_json_file(path, "tokenizer settings")
    if not isinstance(settings, dict):
        raise InputError(f"{path}: expected a JSON object of tokenizer settings, got a {type(settings).__name__}")
    for key, types in _TOKENIZER_TYPES.items():
        if key in settings and not isinstance(settings[key], types):
            raise InputError(f"{path}: {key} must be true, false or null, got {settings[key]!r}")
    return settings


def _no_model_message(directory: Path) -> str:
    """What a model directory may hold, in each layout `read_checkpoint` reads, and what this one holds."""
    held = sorted(f"{c.name}/" if c.is_dir() else c.name for c in directory.iterdir())
    shown = ", ".join(held[:12]) + (f", ... ({len(held)} in all)" if len(held) > 12 else "") if held else "nothing"
    return (
        f"no model in {directory}: looked for {WEIGHTS_NAME} (this project's native layout, transformers' and "
        f"sentence-transformers' too) or pytorch_model.bin (transformers), and a TF checkpoint (a `checkpoint` file "
        f"or *.index); it holds {shown}. Pass the directory that has the weights (e.g. OUTPUT_DIR/model)"
    )


def read_checkpoint(
    path: str | os.PathLike, config_file: str | os.PathLike | None = None, verify: bool = True
) -> Checkpoint:
    """Read weights in any supported format, with the config, vocab and tokenizer settings beside them.

    Args:
        path: a directory, a `.safetensors` / `.bin` file, a TF prefix (`.../bert_model.ckpt`) or one of
            its `.index` / `.data-*` files.
        config_file: a config to use instead of the one found beside the weights.
        verify: check a safetensors file's tensors against the digest in its metadata (when it has one).
    """
    p = Path(path)
    if p.is_dir():
        weights = _find_beside(p, (WEIGHTS_NAME, "pytorch_model.bin"))
        base = p
    elif p.is_file() and p.suffix in (".safetensors", ".bin"):
        weights, base = p, p.parent
    else:
        weights, base = None, p.parent
    if weights is not None and weights.suffix == ".safetensors":
        state, fmt = _read_safetensors(weights, verify), "safetensors"
    elif weights is not None:
        state, fmt = _read_bin(weights), "bin"
    else:
        if p.is_dir() and not (p / "checkpoint").is_file() and not any(p.glob("*.index")):
            raise InputError(_no_model_message(p))
        tf_like = p.is_dir() or p.with_name(p.name + ".index").exists() or p.suffix == ".index" or ".data-" in p.name
        if not tf_like:
            raise InputError(
                f"checkpoint {path} does not exist; pass a directory with model.safetensors, a .safetensors or "
                ".bin file, or a TF prefix such as .../bert_model.ckpt"
            )
        state, base = _read_tf(str(path))
        fmt = "tf"
    state = {_normalise_key(k): v for k, v in state.items() if k not in _IGNORED_KEYS}
    _check_finite(state, weights or path)
    return read_beside(base, Checkpoint(state, str(path), fmt), config_file)


def read_beside(base: Path, ckpt: Checkpoint, config_file: str | os.PathLike | None = None) -> Checkpoint:
    """`ckpt` with the config, vocab and tokenizer settings found in the directory `base` (weights of any
    format, or an exported ONNX file, `bert.onnx_backend`)."""
    config_path = Path(config_file) if config_file else _find_beside(base, (CONFIG_NAME, "bert_config.json"))
    if config_path is not None:
        ckpt.config = BertConfig.from_json_file(config_path)
        check_config_against_weights(ckpt.config, ckpt.state_dict, str(config_path), ckpt.source)
    vocab = _find_beside(base, (VOCAB_NAME,))
    ckpt.vocab_file = str(vocab) if vocab else None
    tok = _find_beside(base, (TOKENIZER_CONFIG_NAME,))
    ckpt.tokenizer_settings = _read_tokenizer_settings(tok) if tok is not None else {}
    return ckpt


def architecture(ckpt: Checkpoint, supported: Collection[str], user: str) -> str:
    """The model class a checkpoint is: `architectures[0]` of its config or, without one (the original's
    checkpoints), the head its weights hold. `user` ("this project runs", "export supports") and the
    `supported` class names make the error when the config names another class."""
    archs = ckpt.config.extra.get("architectures") if ckpt.config is not None else None
    if isinstance(archs, list) and archs:
        if not isinstance(archs[0], str) or archs[0] not in supported:
            raise InputError(
                f"{ckpt.source}: config.json names the architecture {archs[0]!r}; {user} {', '.join(supported)}"
            )
        return archs[0]
    keys = ckpt.state_dict.keys()
    if "qa_outputs.weight" in keys:
        return "BertForQuestionAnswering"
    if "classifier.weight" in keys:
        return "BertForSequenceClassification"  # run_classifier.py's output_weights
    if "cls.predictions.transform.dense.weight" in keys:
        return "BertForPreTraining"
    return "BertModel"


def _fit_prefix(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Add or strip the `bert.` prefix so encoder-only and with-heads checkpoints load into either."""
    wants_prefix = hasattr(model, "bert")
    has_prefix = any(k.startswith("bert.") for k in state)
    if wants_prefix and not has_prefix:
        return {f"bert.{k}": v for k, v in state.items()}
    if not wants_prefix and has_prefix:
        return {k[len("bert.") :]: v for k, v in state.items() if k.startswith("bert.")}
    return state


def load_into(model: nn.Module, ckpt: Checkpoint) -> set[str]:
    """Copy the checkpoint's weights into `model` like the original's assignment map does; returns the names (the
    model's) of those copied.

    Weights only the model has (a new task head) keep their initialisation; weights only the checkpoint
    has (other heads) are ignored; a shape mismatch, or encoder weights missing from the checkpoint,
    is an error (the checkpoint is for another shape).
    """
    state = _fit_prefix(ckpt.state_dict, model)
    own = model.state_dict()
    encoder_missing = []
    for key, target in own.items():
        if key.endswith(TIED_KEY):
            continue
        if key not in state:
            if key.startswith(("bert.embeddings", "bert.encoder", "embeddings.", "encoder.")):
                encoder_missing.append(key)
            continue
        value = state[key]
        if tuple(value.shape) != tuple(target.shape):
            raise InputError(
                f"checkpoint {ckpt.source}: {key} has shape {tuple(value.shape)} but the model expects "
                f"{tuple(target.shape)}; pass the bert_config.json the checkpoint was trained with"
            )
    if encoder_missing:
        raise InputError(
            f"checkpoint {ckpt.source} lacks {len(encoder_missing)} encoder weights (e.g. {encoder_missing[0]}); "
            "it is incomplete or was saved for another number of layers: pass the matching config"
        )
    loadable = {k: v for k, v in state.items() if k in own and not k.endswith(TIED_KEY)}
    new = sorted(k for k in own if k not in state and not k.endswith(TIED_KEY))
    unused = sorted(k for k in state if k not in own)
    model.load_state_dict({**own, **{k: v.to(own[k].dtype) for k, v in loadable.items()}})
    if new:
        logger.info("initialised from scratch (not in the checkpoint): %s", ", ".join(new))
    if unused:
        logger.info("not used from the checkpoint: %s", ", ".join(unused))
    return set(loadable)


# A model class that `build_loaded` returns as itself (bert.modeling's heads).
Model = TypeVar("Model", bound=nn.Module)

# What the layers' and the model's `reset_parameters`/`init_weights` call. Not the meta device: on a meta tensor
# `normal_` runs a Python reference that imports torch._dynamo, 1 s of every inference command's start-up
# (`bert embed` of one line took 3.0 s; bench/RESULTS.md).
_INIT_FUNCTIONS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "xavier_uniform_", "ones_", "zeros_")


# One model at a time is built without initialisers: two threads loading at once (`from_pretrained` is the
# library's) would otherwise save each other's no-ops as the functions to put back, and leave them in place.
_WITHOUT_INIT_LOCK = threading.RLock()


@contextlib.contextmanager
def _without_init() -> Iterator[None]:
    """`torch.nn.init`'s initialisers return their tensor untouched meanwhile, in every thread of the process; the
    tensors keep whatever their memory held until `uninitialised` zeroes them."""
    with _WITHOUT_INIT_LOCK:
        saved = {name: getattr(torch.nn.init, name) for name in _INIT_FUNCTIONS}
        try:
            for name in _INIT_FUNCTIONS:
                setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
            yield
        finally:
            for name, function in saved.items():
                setattr(torch.nn.init, name, function)


def uninitialised(model_class: type[Model], config: BertConfig, **kwargs: Any) -> Model:
    """`model_class(config, **kwargs)` without the random initialisation, its parameters zeroed."""
    with _without_init():
        model = model_class(config, **kwargs)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def build_loaded(
    model_class: type[Model], config: BertConfig, ckpt: Checkpoint, loaded: set[str] | None = None, **kwargs: Any
) -> Model:
    """`model_class(config, **kwargs)` with `ckpt`'s weights (`load_into`), initialised at random only where the
    checkpoint has none (a new task head): the start of a training run. Drawing the rest, all of it overwritten,
    took 1.8 s of all-MiniLM-L6-v2's start-up and 7 s of BERT-Base's (torch's truncated normal, 2 cores).
    `loaded`, where given, receives the names (the model's) of the weights the checkpoint gave."""
    model = uninitialised(model_class, config, **kwargs)
    names = load_into(model, ckpt)
    # BertPreTrainedModel's (bert.modeling, which imports this module, defines the classes built here).
    cast("Callable[..., None]", model.init_weights)(keep=names)
    if loaded is not None:
        loaded.update(names)
    return model


def load_pretrained(cls, path, config: BertConfig | None = None, checkpoint: Checkpoint | None = None, **kwargs):
    """Build `cls` from a checkpoint in any supported format (see `read_checkpoint`)."""
    ckpt = checkpoint or read_checkpoint(path)
    config = config or ckpt.config
    if config is None:
        raise InputError(f"no config.json or bert_config.json beside checkpoint {path}; pass --bert_config_file=PATH")
    check_config_against_weights(config, ckpt.state_dict, "the config", ckpt.source)
    if "num_labels" not in kwargs and "num_labels" in cls.__init__.__code__.co_varnames:
        head = ckpt.state_dict.get("classifier.bias")
        if head is not None:
            kwargs["num_labels"] = head.shape[0]
        elif isinstance(config.extra.get("id2label"), dict):
            kwargs["num_labels"] = len(config.extra["id2label"])
    return build_loaded(cls, config, ckpt, **kwargs)


def _write_tokenizer_config(out: Path, do_lower_case: bool | None, config: BertConfig) -> None:
    """`tokenizer_config.json`: the settings of the tokenizer the model was trained with, as the tokenizer itself
    states them (`FullTokenizer.tokenizer_config`, read back by `bert.inference`), plus the class and length
    transformers' AutoTokenizer needs. Without a casing there is no tokenizer to describe: only those two.

    The length is the one `bert.inference` cuts at: the fine-tuning length a model records (`max_seq_length`),
    else its positions; libraries that load the directory (transformers' tokenizers, sentence-transformers'
    CrossEncoder) cut where this says, so they give the same answers on longer inputs."""
    max_len = config.extra.get("max_seq_length") or config.max_position_embeddings
    settings: dict = {"tokenizer_class": "BertTokenizer", "model_max_length": max_len}
    if do_lower_case is not None:
        # The settings do not depend on the vocabulary: an empty one spares reading it.
        settings.update(FullTokenizer({}, do_lower_case=bool(do_lower_case)).tokenizer_config())
    with atomic_write(out / TOKENIZER_CONFIG_NAME) as f:
        f.write(json.dumps(settings, indent=2) + "\n")


def _copy_vocab(vocab_file: str | os.PathLike | None, out: Path) -> None:
    if vocab_file is None:
        return
    if not Path(vocab_file).is_file():
        raise InputError(f"vocab file {vocab_file} does not exist; pass --vocab_file=PATH")
    if Path(vocab_file).resolve() != (out / VOCAB_NAME).resolve():
        with atomic_write(out / VOCAB_NAME, "wb") as f, open(vocab_file, "rb") as src:
            shutil.copyfileobj(src, f)


def write_vocab(output_dir: str | os.PathLike, vocab: bytes) -> None:
    """`vocab.txt` of a model directory from the vocabulary's bytes (a training run's checkpoints and export,
    which hold the vocabulary as the run read it at its start: see `bert.training.TrainerSettings`)."""
    with atomic_write(Path(output_dir) / VOCAB_NAME, "wb") as f:
        f.write(vocab)


def save_pretrained(
    model: nn.Module,
    output_dir: str | os.PathLike,
    vocab_file: str | os.PathLike | None = None,
    do_lower_case: bool | None = None,
    hf_layout: bool = False,
) -> None:
    """Write the native layout: `model.safetensors`, `config.json`, and the vocab and tokenizer settings.

    The native layout is also transformers' layout; `hf_layout=True` only names the architecture the
    weights belong to, so `transformers.AutoModel*` pick the right class.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = cast(BertConfig, model.config)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not k.endswith(TIED_KEY)}
    with atomic_write(out / WEIGHTS_NAME, "wb") as f:
        f.write(save(state, metadata={"format": "pt", DIGEST_KEY: tensors_digest(state)}))
    d = config.to_dict()
    d["architectures"] = [type(model).__name__]
    num_labels = getattr(model, "num_labels", None)
    if num_labels is not None and hf_layout and "id2label" not in d:
        d["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        d["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    with atomic_write(out / CONFIG_NAME) as f:
        f.write(json.dumps(d, indent=2, sort_keys=True) + "\n")
    _copy_vocab(vocab_file, out)
    _write_tokenizer_config(out, do_lower_case, config)


def export_tf(
    model: nn.Module,
    output_dir: str | os.PathLike,
    vocab_file: str | os.PathLike | None = None,
    do_lower_case: bool | None = None,
) -> Path:
    """Write `bert_model.ckpt.*` with the original variable names, and an original `bert_config.json`."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = cast(BertConfig, model.config)
    state = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items() if not k.endswith(TIED_KEY)}
    if not hasattr(model, "bert"):
        state = {f"bert.{k}": v for k, v in state.items()}
    variables = state_dict_to_tf_variables(state)
    prefix = out / "bert_model.ckpt"
    tf_checkpoint.write_checkpoint(str(prefix), variables)
    with atomic_write(out / "bert_config.json") as f:
        f.write(config.to_original_json_string())
    _copy_vocab(vocab_file, out)
    if do_lower_case is not None:
        _write_tokenizer_config(out, do_lower_case, config)
    return prefix
