"""bert.distillation: the teacher-output cache, the digests, the soft-label losses, students from a teacher's layers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bert.distillation import cached_teacher_outputs, data_digest, weights_digest
from bert.errors import InputError


class Counting:
    """A compute function that records its calls and returns rows of a fixed random array."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self.calls: list[tuple[int, int]] = []
        self.grad_enabled: list[bool] = []

    def __call__(self, start: int, stop: int) -> np.ndarray:
        self.calls.append((start, stop))
        self.grad_enabled.append(torch.is_grad_enabled() or not torch.is_inference_mode_enabled())
        return self.rows[start:stop]


def _rows(n: int = 10, shape: tuple[int, ...] = (3,)) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, *shape)).astype(np.float32)


def test_cache_computes_once_and_returns_compute_output(tmp_path):
    rows = _rows(10, (4, 3))
    first = Counting(rows)
    out = cached_teacher_outputs(tmp_path / "cache", {"teacher": "t", "data": "d"}, 10, (4, 3), first, batch_rows=4)
    assert first.calls == [(0, 4), (4, 8), (8, 10)]
    assert first.grad_enabled == [False, False, False]  # every chunk under torch.inference_mode
    assert isinstance(out, np.memmap) and out.dtype == np.float32 and not out.flags.writeable
    np.testing.assert_array_equal(out, rows)
    second = Counting(rows)
    again = cached_teacher_outputs(tmp_path / "cache", {"data": "d", "teacher": "t"}, 10, (4, 3), second, batch_rows=4)
    assert second.calls == []  # same key (in any order): read back, the teacher does not run
    np.testing.assert_array_equal(again, rows)
    manifest = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())
    assert manifest == {"key": {"data": "d", "teacher": "t"}, "rows": 10, "shape": [4, 3], "dtype": "float32"}


def test_teacher_labelling_shows_a_progress_bar(tmp_path, progress_bars):
    cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), Counting(_rows()), batch_rows=4, desc="labels")
    assert progress_bars()["labels"] == (3, 3)  # chunks of 4 rows


def test_cache_recomputes_for_another_key_or_shape(tmp_path):
    rows = _rows()
    cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), Counting(rows))
    other = Counting(rows * 2)
    out = cached_teacher_outputs(tmp_path, {"teacher": "b"}, 10, (3,), other)
    assert other.calls == [(0, 10)]
    np.testing.assert_array_equal(out, rows * 2)
    fewer = Counting(rows)
    out = cached_teacher_outputs(tmp_path, {"teacher": "a"}, 6, (3,), fewer)  # same key, other row count
    assert fewer.calls == [(0, 6)]
    np.testing.assert_array_equal(out, rows[:6])


def test_cache_ignores_killed_and_truncated_files(tmp_path):
    rows = _rows()
    cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), Counting(rows))
    (array,) = tmp_path.glob("*.npy")
    # A run killed while writing leaves a temporary file; one cut short leaves a truncated array.
    leftover = tmp_path / f".{array.name}.abcd1234.tmp"
    leftover.write_bytes(b"\x93NUMPY partial")
    array.write_bytes(array.read_bytes()[:100])
    again = Counting(rows)
    out = cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), again)
    assert again.calls == [(0, 10)]
    np.testing.assert_array_equal(out, rows)
    assert not leftover.exists()
    # A killed run between the rename and the manifest: no manifest, so the array is not trusted.
    next(tmp_path.glob("*.json")).unlink()
    third = Counting(rows)
    cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), third)
    assert third.calls == [(0, 10)]


def test_cache_interrupted_compute_leaves_nothing_under_the_final_name(tmp_path):
    def failing(start: int, stop: int) -> np.ndarray:
        if start >= 4:
            raise KeyboardInterrupt
        return _rows()[start:stop]

    with pytest.raises(KeyboardInterrupt):
        cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), failing, batch_rows=4)
    assert list(tmp_path.iterdir()) == []


def test_cache_rejects_non_finite_teacher_outputs(tmp_path):
    rows = _rows()
    rows[7, 1] = np.nan
    with pytest.raises(InputError, match=r"my-teacher: .*row 7 is not a finite number"):
        cached_teacher_outputs(tmp_path, {"teacher": "a"}, 10, (3,), Counting(rows), batch_rows=4, desc="my-teacher")
    assert not list(tmp_path.glob("*.npy"))


# One of two processes sharing a cache: both start computing the same entry at once (each waits for the other's
# "ready" file), and each records its compute calls and saves what it got.
_SHARED_CACHE_RUN = """
import sys, time
from pathlib import Path
import numpy as np
from bert.distillation import cached_teacher_outputs
cache, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(cache.parent / f"ready-{me}").touch()
deadline = time.monotonic() + 60
while not (cache.parent / f"ready-{other}").exists() and time.monotonic() < deadline:
    time.sleep(0.005)
rows = np.arange(40, dtype=np.float32).reshape(8, 5)
def compute(start, stop):
    with open(cache.parent / "calls.txt", "a") as f:
        f.write(f"{me} {start}\\n")
    time.sleep(0.2)
    return rows[start:stop]
out = cached_teacher_outputs(cache, {"teacher": "t"}, 8, (5,), compute, batch_rows=2)
np.save(cache.parent / f"out-{me}.npy", np.asarray(out))
"""


def test_cache_shared_by_two_processes_is_computed_once(tmp_path):
    # A grid's cells share --teacher_cache_dir: the second waits for the first's entry instead of computing it
    # again (and, before the lock, removing the first's temporary file from under it).
    script = tmp_path / "run.py"
    script.write_text(_SHARED_CACHE_RUN)
    runs = [
        subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), me, other])
        for me, other in (("a", "b"), ("b", "a"))
    ]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    calls = (tmp_path / "calls.txt").read_text().split()
    assert len(calls) == 8 and len(set(calls[::2])) == 1  # 4 chunks, all computed by one of the two
    rows = np.arange(40, dtype=np.float32).reshape(8, 5)
    for me in "ab":
        np.testing.assert_array_equal(np.load(tmp_path / f"out-{me}.npy"), rows)
    assert sorted(p.suffix for p in (tmp_path / "cache").iterdir()) == [".json", ".npy"]  # no lock left behind


def test_data_digest_frames_parts(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("xy")
    b.write_text("xy")
    assert data_digest(a, 1) == data_digest(b, 1)  # files by content, not name
    assert data_digest(a, 1) != data_digest(a, 2)
    assert data_digest("ab", "c") != data_digest("a", "bc")
    assert data_digest({"x": 1, "y": [1, 2]}) == data_digest({"y": [1, 2], "x": 1})
    a.write_text("xz")
    assert data_digest(a, 1) != data_digest(b, 1)


def test_weights_digest_is_the_saved_one_or_the_tensors(tmp_path, tiny_config):
    from bert.checkpoint import read_checkpoint, save_pretrained, tensors_digest
    from bert.modeling import BertModel

    torch.manual_seed(0)
    model = BertModel(tiny_config)
    save_pretrained(model, tmp_path / "m")
    digest = weights_digest(tmp_path / "m")
    assert digest == tensors_digest(read_checkpoint(tmp_path / "m").state_dict)
    torch.save(model.state_dict(), tmp_path / "m.bin")
    assert len(weights_digest(tmp_path / "m.bin")) == 64
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[0, 0] += 1
    save_pretrained(model, tmp_path / "m2")
    assert weights_digest(tmp_path / "m2") != digest


def test_student_from_teacher_layers_copies_those_layers(tiny_config):
    import dataclasses

    from bert.distillation import student_from_teacher_layers
    from bert.modeling import BertForSequenceClassification

    torch.manual_seed(0)
    teacher_config = dataclasses.replace(tiny_config, num_hidden_layers=5, extra={"id2label": {"0": "a", "1": "b"}})
    teacher = BertForSequenceClassification(teacher_config, num_labels=2)
    layers = [0, 2, 4]
    config, state = student_from_teacher_layers(teacher.state_dict(), teacher_config, layers)
    assert config == dataclasses.replace(teacher_config, num_hidden_layers=3)
    student = BertForSequenceClassification(config, num_labels=2)
    student.load_state_dict(state, strict=True)  # every tensor of the student, nothing else
    teacher_state = teacher.state_dict()
    for name, tensor in student.state_dict().items():
        if ".encoder.layer." in name:
            i = int(name.split(".encoder.layer.")[1].split(".")[0])
            source = name.replace(f".encoder.layer.{i}.", f".encoder.layer.{layers[i]}.")
        else:
            source = name
        assert torch.equal(tensor, teacher_state[source]), name
    assert not torch.equal(
        student.state_dict()["bert.encoder.layer.1.attention.self.query.weight"],
        teacher_state["bert.encoder.layer.1.attention.self.query.weight"],
    )


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([0, 5], r"--init_from_teacher_layers=0,5: the teacher has 5 layers, so each index must be between 0 and 4"),
        ([-1], r"the teacher has 5 layers"),
        ([2, 2], r"--init_from_teacher_layers=2,2: name each of the teacher's 5 layers at most once"),
        ([3, 1], r"in increasing order"),
        ([], r"--init_from_teacher_layers is empty"),
    ],
)
def test_student_from_teacher_layers_rejects_bad_indices(tiny_config, layers, message):
    import dataclasses

    from bert.distillation import student_from_teacher_layers

    with pytest.raises(InputError, match=message):
        student_from_teacher_layers({}, dataclasses.replace(tiny_config, num_hidden_layers=5), layers)


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_kd_classification_loss_is_hintons_kl(temperature):
    from bert.distillation import kd_classification_loss

    g = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(5, 4, generator=g) * 3, torch.randn(5, 4, generator=g) * 3
    got = kd_classification_loss(student, teacher, temperature)
    t = temperature
    # torch's kl_div takes the student's log-probabilities and the teacher's probabilities: KL(teacher || student).
    oracle = F.kl_div(
        F.log_softmax(student / t, -1), F.softmax(teacher / t, -1), reduction="none", log_target=False
    ).sum(-1)
    torch.testing.assert_close(got, oracle * t * t, atol=1e-6, rtol=0)
    # By hand, in float64.
    s, q = student.double() / t, teacher.double() / t
    p_t = q.exp() / q.exp().sum(-1, keepdim=True)
    p_s = s.exp() / s.exp().sum(-1, keepdim=True)
    by_hand = (p_t * (p_t.log() - p_s.log())).sum(-1) * t * t
    torch.testing.assert_close(got.double(), by_hand, atol=1e-6, rtol=0)
    assert torch.all(kd_classification_loss(teacher, teacher, temperature).abs() < 1e-6)  # zero at the teacher


def test_kd_regression_and_multi_label_losses_are_their_formulas():
    from bert.distillation import kd_multi_label_loss, kd_regression_loss

    g = torch.Generator().manual_seed(2)
    student, teacher = torch.randn(6, 1, generator=g), torch.randn(6, 1, generator=g)
    torch.testing.assert_close(
        kd_regression_loss(student, teacher), F.mse_loss(student, teacher, reduction="none")[:, 0], atol=1e-6, rtol=0
    )
    student, teacher = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    t = 2.0
    q = 1 / (1 + np.exp(-teacher.double().numpy() / t))
    s = 1 / (1 + np.exp(-student.double().numpy() / t))
    by_hand = -(q * np.log(s) + (1 - q) * np.log(1 - s)).sum(-1) * t * t
    np.testing.assert_allclose(kd_multi_label_loss(student, teacher, t).numpy(), by_hand, atol=1e-6, rtol=0)


def test_kd_token_loss_sums_the_masked_tokens():
    from bert.distillation import kd_classification_loss, kd_token_loss

    g = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]])
    got = kd_token_loss(student, teacher, mask, 2.0)
    for b in range(2):
        keep = mask[b].bool()
        expected = kd_classification_loss(student[b][keep], teacher[b][keep], 2.0).sum()
        torch.testing.assert_close(got[b], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
def test_kd_span_loss_is_the_mean_of_start_and_end_kl_over_real_positions(temperature):
    from bert.distillation import kd_span_loss

    g = torch.Generator().manual_seed(4)
    student = (torch.randn(3, 6, 2, generator=g) * 3).requires_grad_()
    teacher = torch.randn(3, 6, 2, generator=g) * 3
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    got = kd_span_loss(student, teacher, mask, temperature)
    t = temperature
    for b in range(3):
        keep = mask[b].bool()
        kls = []
        for side in (0, 1):  # start, end: each a distribution over the window's real positions, in float64
            s, q = student[b, keep, side].double() / t, teacher[b, keep, side].double() / t
            p_t, p_s = q.softmax(0), s.softmax(0)
            kls.append((p_t * (p_t.log() - p_s.log())).sum())
        by_hand = (kls[0] + kls[1]) / 2 * t * t
        # 1e-6 absolute, or relative where T^2 makes the loss large (float32's resolution is 1.2e-7 of it).
        torch.testing.assert_close(got[b].double(), by_hand, atol=1e-6, rtol=1e-6)
    got.sum().backward()  # the padding has no gradient, and no NaN reaches the real positions
    assert torch.isfinite(student.grad).all() and student.grad[1, 3:].abs().max() == 0
    assert torch.all(kd_span_loss(teacher, teacher, mask, temperature).abs() < 1e-6)  # zero at the teacher


def test_span_distillation_loss_mixes_the_labels_loss_only_for_labelled_windows(tiny_config):
    from bert.distillation import LABELLED_KEY, TEACHER_KEY, distillation_loss, kd_span_loss
    from bert.modeling import BertForQuestionAnswering

    torch.manual_seed(0)
    model = BertForQuestionAnswering(tiny_config).eval()
    g = torch.Generator().manual_seed(5)
    batch = {
        "input_ids": torch.randint(0, 99, (4, 7), generator=g),
        "attention_mask": torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7, [1] * 6 + [0]]),
        "token_type_ids": torch.zeros(4, 7, dtype=torch.long),
        "start_positions": torch.tensor([0, 2, 3, 0]),
        "end_positions": torch.tensor([0, 3, 5, 0]),
        TEACHER_KEY: torch.randn(4, 9, 2, generator=g),  # cached at a longer --max_seq_length, zero past the end
        LABELLED_KEY: torch.tensor([1.0, 1.0, 0.0, 0.0]),
    }
    alpha, t = 0.3, 2.0
    loss, logs = distillation_loss("span", alpha, t)(model, batch, {"count": torch.tensor(4.0)})
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    out = model(**inputs, start_positions=batch["start_positions"], end_positions=batch["end_positions"])
    kd = kd_span_loss(out.logits, batch[TEACHER_KEY][:, :7], batch["attention_mask"], t)
    per_window = torch.cat([alpha * kd[:2] + (1 - alpha) * out.example_loss[:2], kd[2:]])
    torch.testing.assert_close(loss, per_window.sum() / 4, atol=1e-6, rtol=0)
    torch.testing.assert_close(logs["kd_loss"], kd.sum() / 4, atol=1e-6, rtol=0)
    # A transfer window's placeholder positions are no label: changing them changes nothing.
    moved = {**batch, "start_positions": torch.tensor([0, 2, 1, 4]), "end_positions": torch.tensor([0, 3, 6, 5])}
    torch.testing.assert_close(distillation_loss("span", alpha, t)(model, moved, {"count": torch.tensor(4.0)})[0], loss)
