"""Shared fixtures and helpers: tiny configs and models, the shared data folder, and the readers of the files
every command writes (eval_results.txt, test_results.tsv, metrics.jsonl, model.safetensors).

Tests import the helpers with `from conftest import ...`.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# CI clones the repo with the project's shared/ folder beside it; BERT_TEST_SHARED points elsewhere (the
# skip summary's own test points it at a folder that does not exist).
SHARED = Path(os.environ.get("BERT_TEST_SHARED") or REPO.parent / "shared")
# Every skip for missing shared data gives this reason, so the summary below can count them.
SHARED_ABSENT = "the shared data folder is not beside the repo"


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with the reason when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent ({SHARED_ABSENT})")
    return path


def pytest_configure(config):
    # One intra-op thread per process, also in the commands the tests start: on tiny models two threads
    # waiting on each other cost several times the work itself, far more on a busy machine. Before the test
    # modules are collected, so torch starts with it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_unconfigure(config):
    """End the run (after pytest's own summary line) by saying loudly how many tests the absence of ../shared
    skipped: a green run without the shared folder has not run the real-data tests."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    skipped = [r for r in reporter.stats.get("skipped", []) if SHARED_ABSENT in str(r.longrepr)]
    if skipped:
        reporter.write_sep(
            "!",
            f"WARNING: {len(skipped)} tests skipped because {SHARED} (the shared data folder) is absent: "
            "these results do not cover the real-data tests",
            red=True,
            bold=True,
        )


@pytest.fixture(autouse=True)
def _deterministic():
    random.seed(0)
    np.random.seed(0)
    # Seeded once a test module has loaded torch (one that loads it later starts from torch's fixed default
    # seed); runs of torch-free tests, such as the skip summary's own test, never load it.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)
    yield
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_default_dtype(torch.float32)


@pytest.fixture
def progress_bars(monkeypatch):
    """A function giving the progress bars the test's code has opened so far: {label: (count reached, total)}.
    `bert.utils.progress` is wrapped where each loaded `bert` module imported it, so import the code under
    test before this fixture runs (at the top of the test module)."""
    from bert import utils

    original, bars = utils.progress, []

    def recording(iterable=None, **kwargs):
        bar = original(iterable, **kwargs)
        bars.append(bar)
        return bar

    for name, module in list(sys.modules.items()):
        if name.startswith("bert") and getattr(module, "progress", None) is original:
            monkeypatch.setattr(module, "progress", recording)
    return lambda: {b.desc: (b.n, b.total) for b in bars}


# ------------------------------------------------------------------------------------------ tiny models
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


# Every head with the extra arguments its constructor takes, for tests that go through all of them.
HEADS = [
    ("BertModel", {}),
    ("BertForPreTraining", {}),
    ("BertForSequenceClassification", {"num_labels": 3}),
    ("BertForQuestionAnswering", {}),
    ("BertForTokenClassification", {"num_labels": 4}),
    ("BertForMultipleChoice", {}),
]


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


def uncased_vocab(directory: Path) -> Path:
    """The released uncased vocab.txt (a fixture of tests/fixtures), written as `directory/vocab.txt`."""
    path = directory / "vocab.txt"
    path.write_bytes(gzip.decompress((FIXTURES / "tokenization" / "vocab_uncased.txt.gz").read_bytes()))
    return path


def vocab_config(vocab: Path, **overrides):
    """A tiny `BertConfig` (2 layers, hidden 32, 4 heads, 64 positions) over the entries of `vocab`."""
    from bert.config import BertConfig

    n = sum(1 for _ in open(vocab, encoding="utf-8"))
    base = dict(
        vocab_size=n,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        hidden_act="gelu",
    )
    return BertConfig(**{**base, **overrides})


def save_model_dir(model, directory: Path, vocab: Path, do_lower_case: bool = True, **extra) -> Path:
    """`model` saved as a native model directory, `extra` added to its config.json (labels, task settings)."""
    from bert.checkpoint import save_pretrained

    model.config.extra.update(extra)
    save_pretrained(model, directory, vocab, do_lower_case=do_lower_case)
    return directory


@pytest.fixture(scope="module")
def model_files(request, tmp_path_factory):
    """(config file, vocab file, init checkpoint) of the test module's tiny model: the shared uncased vocab,
    unless the module sets `TINY_MODEL = dict(vocab="cased.txt", do_lower_case=False, **config overrides)`."""
    spec = {"vocab": "uncased.txt", "do_lower_case": True, **getattr(request.module, "TINY_MODEL", {})}
    vocab = shared_path("data", "vocab", spec.pop("vocab"))
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), vocab, **spec)


def args_for(args_cls, model_files, output_dir: Path, **flags):
    """`args_cls` (a command's Args) for the tiny model `model_files` on the CPU, writing to `output_dir`."""
    config, vocab, init = model_files
    base = dict(
        output_dir=str(output_dir),
        vocab_file=str(vocab),
        bert_config_file=str(config),
        init_checkpoint=str(init),
        device="cpu",
    )
    return args_cls(**{**base, **flags})


def model_flags(model_files, output_dir: Path) -> list[str]:
    """The command-line flags of `args_for`: the tiny model, the output directory, the CPU."""
    config, vocab, init = model_files
    return [
        f"--vocab_file={vocab}",
        f"--bert_config_file={config}",
        f"--init_checkpoint={init}",
        f"--output_dir={output_dir}",
        "--device=cpu",
    ]


# ------------------------------------------------------------------------------------------------- data
def glue_slice(src: Path, dst: Path, **rows: int | None) -> Path:
    """Copy `name=n` files of a GLUE folder keeping the header line and the first n rows (None: all)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name, n in rows.items():
        lines = (src / f"{name}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        (dst / f"{name}.tsv").write_text("".join(lines if n is None else lines[: n + 1]), encoding="utf-8")
    return dst


# A tiny WordPiece vocab for pre-training data: specials, some words, and "##" pieces for whole-word masking.
PIECES_WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "un", "##able", "##s", "##ing", "walk", "."]
PIECES_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *PIECES_WORDS]


@pytest.fixture
def pieces_vocab_file(tmp_path) -> str:
    """PIECES_VOCAB as a vocab file."""
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(PIECES_VOCAB) + "\n")
    return str(path)


def synthetic_data(
    tmp: Path, n: int = 24, seq: int = 32, preds: int = 5, vocab: int = 99, seed: int = 0
) -> tuple[Path, Path]:
    """A small TFRecord of pre-training records like create_pretraining_data's, and its vocab file.

    Vocab ids: 0 [PAD], 1 [UNK], 2 [CLS], 3 [SEP], 4 [MASK], then ordinary words.
    """
    from bert.formats.tfrecord import TFRecordWriter

    rng = np.random.default_rng(seed)
    vocab_file = tmp / "vocab.txt"
    vocab_file.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(5, vocab)])
    )
    path = tmp / "synthetic.tfrecord"
    with TFRecordWriter(path) as w:
        for _ in range(n):
            length = int(rng.integers(seq // 2, seq + 1))
            a = int(rng.integers(1, length - 3))
            tokens = np.concatenate([[2], rng.integers(5, vocab, a), [3], rng.integers(5, vocab, length - a - 3), [3]])
            segment = np.r_[np.zeros(a + 2), np.ones(length - a - 2)]
            cand = np.flatnonzero(tokens >= 5)
            k = min(preds, max(1, round(length * 0.15)))
            pos = np.sort(rng.choice(cand, k, replace=False))
            labels = tokens[pos].copy()
            masked = tokens.copy()
            masked[pos] = 4
            pad = seq - length
            w.write_example(
                {
                    "input_ids": np.r_[masked, np.zeros(pad)].astype(np.int64),
                    "input_mask": np.r_[np.ones(length), np.zeros(pad)].astype(np.int64),
                    "segment_ids": np.r_[segment, np.zeros(pad)].astype(np.int64),
                    "masked_lm_positions": np.r_[pos, np.zeros(preds - k)].astype(np.int64),
                    "masked_lm_ids": np.r_[labels, np.zeros(preds - k)].astype(np.int64),
                    "masked_lm_weights": np.r_[np.ones(k), np.zeros(preds - k)].astype(np.float32),
                    "next_sentence_labels": np.array([rng.integers(0, 2)], dtype=np.int64),
                }
            )
    return path, vocab_file


# ------------------------------------------------------------------------------------- output readers
def squad_slice(version: str, start: int, count: int, path: Path, training: bool) -> Path:
    """Questions `start .. start + count - 1` of the dev set, with their paragraphs, as a SQuAD file.

    For training, an answerable question keeps only its first answer (training wants exactly one).
    """
    with gzip.open(shared_path("data", "squad", f"dev-v{version}.json.gz"), "rt", encoding="utf-8") as f:
        dev = json.load(f)
    data, index = [], 0
    for article in dev["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = []
            for qa in paragraph["qas"]:
                if start <= index < start + count:
                    qa = dict(qa)
                    if training:
                        qa["answers"] = qa["answers"][:1]
                    qas.append(qa)
                index += 1
            if qas:
                paragraphs.append({"context": paragraph["context"], "qas": qas})
        if paragraphs:
            data.append({"title": article["title"], "paragraphs": paragraphs})
        if index >= start + count:
            break
    path.write_text(json.dumps({"version": dev["version"], "data": data}), encoding="utf-8")
    return path


def read_results(path: Path) -> dict[str, str]:
    """eval_results.txt (or test_results.txt) as {key: value text}; its lines must be sorted, as the original's."""
    lines = path.read_text().splitlines()
    assert lines == sorted(lines), f"{path.name}: keys must be sorted"
    return dict(line.split(" = ") for line in lines)


def read_tsv(path: Path) -> np.ndarray:
    """test_results.tsv: one row of numbers per line, no header."""
    return np.array([[float(x) for x in line.split("\t")] for line in path.read_text().splitlines()])


def read_metrics(output_dir: Path) -> list[dict]:
    """The lines of output_dir/metrics.jsonl."""
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def read_weights(model_dir: Path) -> dict:
    """The tensors of model_dir/model.safetensors."""
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    """Two state dicts hold the same names and bit-identical tensors."""
    import torch

    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ: {different[:5]}"


def cli_error(capsys, command: str, *argv: str) -> str:
    """Run `bert COMMAND ARGV...`; assert exit code 2 and that stderr is exactly one error line; return it."""
    from bert.cli import main

    capsys.readouterr()  # what earlier commands printed (their result blocks) is not this command's
    code = main([command, *argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith(f"bert {command}: error:")]
    assert code == 2 and len(errors) == 1, err[-2000:]
    assert err.strip() == errors[0], f"more than the error line on stderr:\n{err[-2000:]}"
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


def assert_model_card(out: Path, command: str, pipeline_tag: str, *flags: str) -> None:
    """OUTPUT/model/README.md: metadata the Hub's own parser reads, the final evaluation's figures (those of
    OUTPUT/eval_results.json) and the command line with `flags`."""
    huggingface_hub = pytest.importorskip("huggingface_hub", reason="the Hub's model-card parser (test extra)")
    card = huggingface_hub.ModelCard.load(out / "model" / "README.md")
    assert card.data.pipeline_tag == pipeline_tag and command in card.data.tags
    results = json.loads((out / "eval_results.json").read_text())
    figures = {k: v for k, v in results.items() if isinstance(v, float)}
    assert figures and set(card.data.metrics) >= {k.removeprefix("eval_") for k in figures if "loss" not in k}
    for key, value in figures.items():
        assert f"| {key} | {value:.6g} |" in card.text, key
    assert f"bert {command}" in card.text and all(flag in card.text for flag in flags)
