"""`bert.loading`, the one loader of saved models: its architecture table is the one the Predictor's tasks
and the exporter's outputs are keyed by, and every reader refuses a model directory with the same line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bert.errors import InputError
from bert.export import OUTPUT_NAMES, export
from bert.inference import TASKS, Predictor
from bert.loading import ARCHITECTURES, build_model, load_model, read_model_checkpoint
from bert.modeling import MODEL_CLASSES, BertForPreTraining, BertModel
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
