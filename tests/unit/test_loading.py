"""`bert.loading`, the one loader of saved models: its architecture table is the one the Predictor's tasks
and the exporter's outputs are keyed by, and every reader refuses a model directory with the same line; a model
is built without drawing the weights its checkpoint gives (`bert.checkpoint.build_loaded`)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time

import pytest
import torch

from bert.checkpoint import build_loaded, uninitialised
from bert.errors import InputError
from bert.export import OUTPUT_NAMES, export
from bert.inference import TASKS, Predictor
from bert.loading import ARCHITECTURES, build_model, load_model, read_model_checkpoint
from bert.modeling import MODEL_CLASSES, BertForPreTraining, BertForSequenceClassification, BertModel
from conftest import save_model_dir, vocab_config

WORDS = ["the", "cat", "sat", "on", "mat"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    return path


def test_one_architecture_table():
    assert set(TASKS) == set(ARCHITECTURES)  # every architecture loaded has a task, and only those
    assert set(OUTPUT_NAMES) <= set(ARCHITECTURES)  # export builds through the same table
    for name, model_class in MODEL_CLASSES.items():
        assert ARCHITECTURES[name] is model_class
    assert ARCHITECTURES["BertForMaskedLM"] is BertForPreTraining


def test_loaded_weights_equal_the_saved_ones(tmp_path, vocab):
    torch.manual_seed(0)
    saved = BertForPreTraining(vocab_config(vocab))
    model, _ = load_model(save_model_dir(saved, tmp_path / "m", vocab))
    assert isinstance(model, BertForPreTraining) and not model.training
    for name, value in saved.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    # The decoder is tied to the word embeddings again, not a copy.
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_loading_skips_the_initialisers_without_importing_dynamo(tmp_path, vocab):
    """The model is built with torch.nn.init's functions as no-ops (restored after), not on the meta device,
    whose normal_ imports torch._dynamo: a second of every inference command's start-up."""
    torch.manual_seed(0)
    model_dir = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "m", vocab)
    normal = torch.nn.init.normal_
    code = (
        "import sys; from bert.loading import load_model; "
        f"load_model({str(model_dir)!r}); print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    load_model(model_dir)
    assert torch.nn.init.normal_ is normal


def test_two_threads_building_at_once_leave_the_initialisers_in_place():
    """Two threads in `uninitialised` at once: the second waits for the first, so neither saves the other's no-op
    initialisers as the ones to put back (the second finishing last would leave them in place for good)."""
    normal = torch.nn.init.normal_
    first_inside, both_inside = threading.Event(), threading.Barrier(2, timeout=0.5)

    class Slow(torch.nn.Module):
        def __init__(self, config, last: bool):
            super().__init__()
            first_inside.set()
            with contextlib.suppress(threading.BrokenBarrierError):
                both_inside.wait()  # unguarded, both threads are inside here at once
            time.sleep(0.2 if last else 0.0)  # and the second leaves last

    first = threading.Thread(target=uninitialised, args=(Slow, None), kwargs={"last": False})
    second = threading.Thread(target=uninitialised, args=(Slow, None), kwargs={"last": True})
    saved = vars(torch.nn.init).copy()
    try:
        first.start()
        assert first_inside.wait(5)
        second.start()
        first.join(5)
        second.join(5)
        assert torch.nn.init.normal_ is normal
    finally:  # (a failure here must not leave the no-ops to the tests after it)
        vars(torch.nn.init).update(saved)


def _drawn(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes `torch.nn.init.trunc_normal_` (the original's initialiser) fills from now on."""
    shapes: list[tuple[int, ...]] = []
    draw = torch.nn.init.trunc_normal_

    def recording(tensor, *args, **kwargs):
        shapes.append(tuple(tensor.shape))
        return draw(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "trunc_normal_", recording)
    return shapes


def test_a_training_start_draws_only_what_the_checkpoint_lacks(tmp_path, vocab, monkeypatch):
    """A run starting from an encoder's weights draws the new classifier alone (drawing the rest took 1.8 s of
    all-MiniLM-L6-v2's start-up), keeps every loaded weight, and draws the classifier as the original would."""
    config = vocab_config(vocab)
    torch.manual_seed(0)
    encoder = BertModel(config)
    model_dir = save_model_dir(encoder, tmp_path / "m", vocab)
    ckpt = read_model_checkpoint(model_dir)
    shapes = _drawn(monkeypatch)
    model = build_loaded(BertForSequenceClassification, config, ckpt, num_labels=3)
    assert shapes == [(3, config.hidden_size)]
    # The library's loader (and `bert convert`'s) builds the same way.
    shapes.clear()
    library = BertForSequenceClassification.from_pretrained(model_dir, num_labels=3)
    assert shapes == [(3, config.hidden_size)]
    torch.testing.assert_close(library.bert.pooler.dense.weight, encoder.pooler.dense.weight, rtol=0, atol=0)
    for name, value in encoder.state_dict().items():
        torch.testing.assert_close(model.bert.state_dict()[name], value, rtol=0, atol=0)
    weight, std = model.classifier.weight, config.initializer_range
    assert weight.abs().max() <= 2 * std and weight.abs().min() > 0 and not model.classifier.bias.any()
    # From no checkpoint every matrix is drawn, once (by the head's init_weights; not by its encoder's as well).
    shapes.clear()
    BertForSequenceClassification(config, num_labels=3)
    assert len(shapes) == sum(isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) for m in model.modules())
    shapes.clear()
    BertModel(config)  # an encoder alone draws its own
    assert len(shapes) == sum(isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) for m in model.bert.modules())


def test_a_layer_the_checkpoint_gives_in_part_keeps_that_part(tmp_path, vocab):
    config = vocab_config(vocab)
    torch.manual_seed(0)
    saved = BertModel(config)
    ckpt = read_model_checkpoint(save_model_dir(saved, tmp_path / "m", vocab))
    del ckpt.state_dict["pooler.dense.bias"]
    model = build_loaded(BertModel, config, ckpt)
    torch.testing.assert_close(model.pooler.dense.weight, saved.pooler.dense.weight, rtol=0, atol=0)
    assert not model.pooler.dense.bias.any()  # drawn as the original does: zeros


def test_a_directory_without_a_config_is_one_message_everywhere(tmp_path, vocab):
    model = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "m", vocab)
    (model / "config.json").unlink()
    expected = f"{model}: no config.json or bert_config.json beside the weights; add the model's config"
    for load in (
        lambda: Predictor.from_pretrained(model, "cpu"),
        lambda: load_model(model),
        lambda: export(model, "torchscript", tmp_path / "m.pt"),
    ):
        with pytest.raises(InputError) as e:
            load()
        assert str(e.value) == expected
    with pytest.raises(InputError, match="^--teacher=T: no config.json"):
        read_model_checkpoint(model, name="--teacher=T")


def test_a_classifier_without_its_head_names_the_command_that_trains_it(tmp_path, vocab):
    model = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "m", vocab)
    ckpt = read_model_checkpoint(model)
    with pytest.raises(InputError, match="weights have no classifier; fine-tune it with `bert ner`"):
        build_model(ckpt, "BertForTokenClassification")
    with pytest.raises(InputError, match=r"lack \d+ of BertForQuestionAnswering's"):
        build_model(ckpt, "BertForQuestionAnswering")
    assert isinstance(build_model(ckpt, "BertModel"), BertModel)
