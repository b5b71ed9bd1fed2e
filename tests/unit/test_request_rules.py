"""`bert.request_rules`: each option rule has one definition, and the commands' flags, the Predictor and the
server say the same thing about the same bad value (each in its own spelling of the name)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.errors import InputError
from bert.inference import Predictor
from bert.loading import ARCHITECTURES
from bert.modeling import BertForPreTraining, BertModel
from bert.request_rules import (
    TASKS,
    TOP_K_MINIMUM,
    TRUNCATION_DIRECTION_SPELLINGS,
    check_dimensions,
    check_pooling,
    check_top_k,
    has_head,
    truncation_direction,
)
from bert.tasks.common import CLASSIFICATION, EMBEDDINGS, FILL_MASK
from conftest import cli_error, save_model_dir, uncased_vocab, vocab_config

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
from bert.serving import ENDPOINTS, ApiError, ServeSettings  # noqa: E402
from bert.serving.checks import option_value  # noqa: E402
from bert.serving.routes import Api  # noqa: E402
from bert.serving.schemas import ENDPOINT  # noqa: E402


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    return uncased_vocab(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def encoder(vocab, tmp_path_factory) -> Predictor:
    torch.manual_seed(3)
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path_factory.mktemp("enc"), vocab)
    return Predictor.from_pretrained(directory, "cpu", max_seq_length=16)


def _unnamed(message: str, name: str) -> str:
    """A message with the value's name (`top_k`, `--top_k`, `"top_k"`) taken out."""
    assert name in message, message
    return message.replace(name, "NAME", 1)


def _server_error(value, schema: dict, name: str) -> str:
    with pytest.raises(ApiError) as refused:
        option_value(value, schema, name)
    assert refused.value.status == 422
    return refused.value.message


def test_the_rules():
    check_top_k(None)
    check_top_k(TOP_K_MINIMUM)
    with pytest.raises(InputError, match="^top_k=0 must be at least 1$"):
        check_top_k(0)
    check_top_k(0, zero="all labels")  # a classifier's "every label"
    with pytest.raises(InputError, match=r"^top_k=-1 must be 0 \(all labels\) or more$"):
        check_top_k(-1, zero="all labels")
    check_dimensions(None, 32)
    check_dimensions(32, 32)
    for bad in (0, 33):
        with pytest.raises(InputError, match=f"^dimensions={bad} must be between 1 and the model's 32$"):
            check_dimensions(bad, 32)
    # TEI's spelling of a direction is ours too; any other spelling is refused, as the server's schema says.
    assert [truncation_direction(d) for d in TRUNCATION_DIRECTION_SPELLINGS] == ["left", "right", "left", "right"]
    for bad in ("RIGHT", "lEFT", "up"):
        with pytest.raises(InputError, match="must be one of right, left"):
            truncation_direction(bad)
    check_pooling("pooler")
    with pytest.raises(InputError, match="^pooling='sum' must be one of cls, mean, max, pooler$"):
        check_pooling("sum")


def test_every_architecture_has_a_task_and_fill_mask_needs_the_mlm_weights():
    assert set(TASKS) == set(ARCHITECTURES)
    assert has_head("BertForSequenceClassification", False, CLASSIFICATION)
    assert not has_head("BertForSequenceClassification", False, EMBEDDINGS)
    assert has_head("BertForMaskedLM", True, FILL_MASK)
    assert not has_head("BertForPreTraining", False, FILL_MASK)  # weights without cls.predictions.*


def test_predictor_and_server_ask_the_same_head(vocab, tmp_path, encoder):
    # A BertForPreTraining directory saved without its masked-LM weights: no fill-mask, from either side.
    torch.manual_seed(0)
    mlm = BertForPreTraining(vocab_config(vocab))
    full = save_model_dir(mlm, tmp_path / "mlm", vocab)
    with_head = Predictor.from_pretrained(full, "cpu", max_seq_length=16)
    fill = ENDPOINT["/fill-mask"]
    assert with_head.has_head(FILL_MASK) and fill.serves(with_head)
    assert not encoder.has_head(FILL_MASK) and not fill.serves(encoder)
    with pytest.raises(InputError, match="without a fill-mask head"):
        encoder.fill_mask(["a [MASK] b"])
    with_head.has_mlm_head = False  # what a checkpoint without cls.predictions.* loads as
    assert not with_head.has_head(FILL_MASK) and not fill.serves(with_head)


def test_a_bad_top_k_reads_alike_from_the_flag_the_predictor_and_the_server(encoder, capsys):
    flag = cli_error(capsys, "search", "--model=m", "--queries=q", "--corpus=c", "--top_k=0")
    flag = flag.removeprefix("bert search: error: ")
    for command in ("fill-mask", "rerank"):
        assert cli_error(capsys, command, "--model=m", "--top_k=0").endswith(flag), command
    with pytest.raises(InputError) as raised:
        encoder.rank("query", ["a document"], top_k=0)
    predictor = str(raised.value)
    server = _server_error(0, ENDPOINT["/fill-mask"].fields["top_k"].schema, "top_k")
    parameters = ENDPOINT["/predict"].fields["parameters"].schema
    nested = _server_error({"top_k": 0}, parameters, "parameters")
    assert _unnamed(flag, "--top_k") == _unnamed(predictor, "top_k") == _unnamed(server, '"top_k"')
    assert _unnamed(nested, '"parameters.top_k"') == _unnamed(predictor, "top_k") == "NAME=0 must be at least 1"
    # bert predict's --top_k counts labels, 0 being all of them: refused below 0 alike.
    assert cli_error(capsys, "predict", "--model=m", "--top_k=-1").endswith("--top_k=-1 must not be negative")
    with pytest.raises(InputError, match=re.escape("top_k=-1 must be 0 (all labels) or more")):
        Predictor.classify(encoder, ["x"], top_k=-1)  # checked before the head is asked for


def test_dimensions_read_alike_from_the_predictor_and_the_server(encoder):
    api = Api(encoder, ServeSettings(model_id="test"))  # no model thread: the handler's check alone
    for bad in (33, 100):
        with pytest.raises(InputError) as raised:
            encoder.embed(["x"], dimensions=bad)
        with pytest.raises(ApiError) as refused:
            api._dimensions({"dimensions": bad})
        assert refused.value.status == 422
        assert _unnamed(refused.value.message, '"dimensions"') == _unnamed(str(raised.value), "dimensions")
    assert api._dimensions({"dimensions": 8}) == 8
    low = _server_error(0, ENDPOINT["/embed"].fields["dimensions"].schema, "dimensions")
    assert low == '"dimensions"=0 must be at least 1'


def test_truncation_directions_the_server_publishes_are_the_predictors(encoder):
    text = " ".join(["word"] * 20) + " end"
    for e in ENDPOINTS:
        field = e.fields.get("truncation_direction")
        if field is None:
            continue
        assert field.schema["enum"] == list(TRUNCATION_DIRECTION_SPELLINGS), e.path
        for spelling in field.schema["enum"]:
            assert option_value(spelling, field.schema, "truncation_direction") == spelling
            np.testing.assert_array_equal(
                encoder.embed([text], truncation_direction=spelling),
                encoder.embed([text], truncation_direction=spelling.lower()),
            )
        message = _server_error("RIGHT", field.schema, "truncation_direction")
        assert message.startswith('"truncation_direction" must be "left" or "right" or "Left" or "Right"')
    with pytest.raises(InputError, match="truncation_direction='RIGHT' must be one of right, left"):
        encoder.embed([text], truncation_direction="RIGHT")
    left = encoder.embed([text], truncation_direction="Left")
    assert not np.allclose(left, encoder.embed([text], truncation_direction="Right"))  # the spelling reaches the cut
