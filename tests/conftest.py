"""Shared fixtures: tiny configs and models, paths to the repo's fixtures and to the shared data folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# CI clones the repo with the project's shared/ folder beside it.
SHARED = REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with the reason when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared data folder is not beside the repo)")
    return path


@pytest.fixture(autouse=True)
def _deterministic():
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    try:
        import torch
    except ImportError:  # tokenizer-only environments
        yield
        return
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)


@pytest.fixture
def tiny_config():
    from bert.config import BertConfig

    # The shape of the original modeling_test.py, with 2 layers.
    return BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        type_vocab_size=2,
    )


def write_tiny_config(path: Path, vocab_size: int = 30522, **overrides) -> Path:
    """A BERT config file: hidden 32, 2 layers, attention dropout off (it dominates the step time on CPU)."""
    config = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 37,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": 128,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
    }
    path.write_text(json.dumps({**config, **overrides}))
    return path


def save_tiny_model(directory: Path, vocab: Path, do_lower_case: bool, **overrides) -> tuple[Path, Path, Path]:
    """(config file, vocab file, init checkpoint): a random tiny pre-training model over `vocab`."""
    import torch

    from bert.checkpoint import save_pretrained
    from bert.config import BertConfig
    from bert.modeling import BertForPreTraining

    vocab_size = sum(1 for _ in open(vocab, encoding="utf-8"))
    config = write_tiny_config(directory / "bert_config.json", vocab_size, **overrides)
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_json_file(config))
    save_pretrained(model, directory / "init", vocab, do_lower_case=do_lower_case)
    return config, vocab, directory / "init"


def cli_error(capsys, command: str, *argv: str) -> str:
    """Run `bert COMMAND ARGV...`; assert exit code 2 and exactly one error line, and return that line."""
    from bert.cli import main

    code = main([command, *argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith(f"bert {command}: error:")]
    assert code == 2 and len(errors) == 1, err[-2000:]
    return errors[0]
