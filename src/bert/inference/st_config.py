"""What a sentence-transformers model directory says about its embeddings: `modules.json`, its Pooling
module's `config.json`, `sentence_bert_config.json` and `config_sentence_transformers.json` (prompts), each
checked as it is read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bert.config import check_setting
from bert.errors import InputError
from bert.utils import load_json_file


@dataclass
class SentenceTransformersConfig:
    """What a sentence-transformers model directory says about its embeddings."""

    pooling: str | None  # None: a pooling (or module) this project does not implement
    normalize: bool
    max_seq_length: int | None
    unsupported: str | None = None  # why `pooling` is None
    # `config_sentence_transformers.json`: prompt texts by name, and the one used when a call names none.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    include_prompt: bool = True  # the Pooling module's: whether the prompt's tokens are pooled


def read_sentence_transformers_config(model_dir: str | os.PathLike) -> SentenceTransformersConfig | None:
    """`modules.json`, its Pooling module's `config.json` and `sentence_bert_config.json`, or None."""
    base = Path(model_dir)
    modules_file = base / "modules.json"
    if not modules_file.is_file():
        return None
    modules = load_json_file(modules_file, "sentence-transformers file")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise InputError(f"{modules_file}: expected a list of modules; fix or delete it")
    pooling, normalize, unsupported, include_prompt = None, False, None, True
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Transformer":
            continue
        if kind == "Normalize":
            normalize = True
        elif kind == "Pooling":
            config = _json_object(base / str(m.get("path", "")) / "config.json", "Pooling module file")
            modes = sorted(k[len("pooling_mode_") :] for k, v in config.items() if k.startswith("pooling_mode_") and v)
            pooling = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max"}.get(modes[0]) if modes else None
            if len(modes) != 1 or pooling is None:
                unsupported = f"pooling modes {modes}"
            include_prompt = config.get("include_prompt", True) is not False
        else:
            unsupported = f"a {kind} module"
    if unsupported:
        pooling = None
    settings = base / "sentence_bert_config.json"
    st_settings = _json_object(settings, "sentence-transformers file", missing_ok=True)
    check_setting(st_settings, "max_seq_length", int, settings, null=True)
    max_seq_length = st_settings.get("max_seq_length")
    prompts_file = base / "config_sentence_transformers.json"
    described = _json_object(prompts_file, "sentence-transformers file", missing_ok=True)
    prompts = described.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise InputError(f'{prompts_file}: "prompts" must map prompt names to texts; fix or delete it')
    default_prompt_name = described.get("default_prompt_name")
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise InputError(
            f'{prompts_file}: "default_prompt_name" {default_prompt_name!r} is not one of the prompts '
            f"({', '.join(prompts) or 'none'}); fix or delete it"
        )
    return SentenceTransformersConfig(
        pooling, normalize, max_seq_length, unsupported, prompts, default_prompt_name, include_prompt
    )


def _json_object(path: Path, what: str, missing_ok: bool = False) -> dict:
    """A sentence-transformers settings file, which must hold one JSON object ({} when missing and
    `missing_ok`): a list or a number there would fail later with a bare AttributeError."""
    settings = load_json_file(path, what, missing_ok=missing_ok)
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise InputError(f"{path}: expected a JSON object of settings; fix or delete it")
    return settings
