"""`bert ner --teacher`: per-token distillation end to end on tiny models (`bert.distillation`).

The teacher is a tiny token classifier over the student's cased vocabulary whose classifier bias makes it tag
every word B-MISC, so what the student learns from it is plain to see.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.ner import NerArgs, run_ner
from bert.tasks.ner import CONLL2003_LABELS
from conftest import args_for, cli_error, model_flags, save_model_dir, shared_path, vocab_config

TINY_MODEL = dict(vocab="cased.txt", do_lower_case=False)  # conftest's model_files: the teacher's vocabulary
TAG = "B-MISC"


def sentences(path: Path, n: int) -> list[list[str]]:
    """The first `n` sentences of a CoNLL file, as their lines."""
    out: list[list[str]] = [[]]
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("-DOCSTART-"):
            continue
        if line.strip():
            out[-1].append(line)
        elif out[-1]:
            if len(out) == n:
                break
            out.append([])
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    src = shared_path("data", "conll2003")
    dst = tmp_path_factory.mktemp("conll")
    for name, n in (("train.txt", 16), ("valid.txt", 16), ("test.txt", 24)):
        (dst / name).write_text("\n\n".join("\n".join(s) for s in sentences(src / name, n)) + "\n")
    # The transfer set: words alone, one per line, no tags (the teacher labels them).
    words = ["\n".join(line.split()[0] for line in s) for s in sentences(src / "test.txt", 32)[8:]]
    (dst / "transfer.txt").write_text("\n\n".join(words) + "\n")
    return dst


@pytest.fixture(scope="module")
def teacher(model_files, tmp_path_factory) -> Path:
    from bert.modeling import BertForTokenClassification

    _, vocab, _ = model_files
    torch.manual_seed(1)
    model = BertForTokenClassification(vocab_config(vocab, max_position_embeddings=64), num_labels=9)
    with torch.no_grad():
        model.classifier.bias.zero_()
        model.classifier.bias[CONLL2003_LABELS.index(TAG)] = 4.0
    labels = {"id2label": {str(i): t for i, t in enumerate(CONLL2003_LABELS)}}
    return save_model_dir(model, tmp_path_factory.mktemp("teacher") / "model", vocab, do_lower_case=False, **labels)


def tagged(out: Path) -> float:
    """The share of the test words a run's test_predictions.txt tags TAG."""
    preds = [line.split()[-1] for line in (out / "test_predictions.txt").read_text().splitlines() if line.strip()]
    return sum(p == TAG for p in preds) / len(preds)


def test_ner_student_learns_the_teachers_tags(model_files, data, teacher, tmp_path):
    base = dict(
        data_dir=str(data),
        do_lower_case=False,
        do_train=True,
        do_predict=True,
        max_seq_length=48,
        train_batch_size=8,
        learning_rate=3e-3,
        num_train_epochs=3.0,
    )
    run_ner(args_for(NerArgs, model_files, tmp_path / "plain", **base))
    result = run_ner(
        args_for(
            NerArgs,
            model_files,
            tmp_path / "distilled",
            teacher=str(teacher),
            transfer_file=str(data / "transfer.txt"),
            distill_alpha=1.0,
            **base,
        )
    )
    assert result["global_step"] == int((16 + 24) / 8 * 3)  # transfer sentences are counted
    (cached,) = (tmp_path / "distilled" / "teacher_cache").glob("*.npy")
    rows = np.load(cached)  # a row per feature (long sentences are windows): the teacher's logits at each piece
    assert rows.shape[0] >= 16 + 24 and rows.shape[1:] == (48, 9)
    plain, distilled = tagged(tmp_path / "plain"), tagged(tmp_path / "distilled")
    assert distilled > 0.8 > plain, (plain, distilled)


def test_ner_teacher_must_share_the_vocabulary(model_files, data, teacher, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(teacher, other)
    (other / "vocab.txt").write_text((other / "vocab.txt").read_text().replace("[unused1]", "[unusedX]"))
    flags = [*model_flags(model_files, tmp_path / "out"), f"--data_dir={data}", "--do_train", "--do_lower_case=false"]
    error = cli_error(capsys, "ner", *flags, f"--teacher={other}")
    assert f"--teacher={other}: its vocab.txt is not the student's --vocab_file" in error
