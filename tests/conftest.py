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


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header; asserts the file is a PNG."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def check_curves(output_dir: Path, png: Path | None = None) -> dict:
    """Assert that a training run drew `curves.png` (1500 x 450 pixels) and that the series it drew, as
    recorded in the JSON beside it, are those of `metrics.jsonl`: the training loss and learning rate of
    every training line, and each evaluation metric of the evaluation lines plus the final evaluation of
    `eval_results.json` at its global_step. Returns the record."""
    png = png or output_dir / "curves.png"
    assert png_size(png) == (1500, 450)
    record = json.loads(png.with_suffix(".json").read_text())
    (run,) = record["runs"]
    lines = [json.loads(s) for s in (output_dir / "metrics.jsonl").read_text().splitlines() if s.strip()]
    training = [m for m in lines if "learning_rate" in m]
    for key in ("loss", "learning_rate"):
        assert run["train"][key] == {"steps": [m["step"] for m in training], "values": [m[key] for m in training]}
    final = json.loads((output_dir / "eval_results.json").read_text())
    for key, drawn in run["eval"].items():
        points = {m["step"]: m[key] for m in lines if "learning_rate" not in m and key in m}
        raw = key if key in final else key[len("eval_") :]
        if raw in final:
            points.setdefault(final.get("global_step", training[-1]["step"]), final[raw])
        assert drawn == {"steps": sorted(points), "values": [points[s] for s in sorted(points)]}, key
    return record
