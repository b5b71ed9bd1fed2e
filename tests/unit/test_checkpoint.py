"""Checkpoints in every format: native, transformers (safetensors and .bin), TF; lossless round trips."""

import json
import pickle

import pytest
import torch

from bert import modeling
from bert.checkpoint import export_tf, read_checkpoint, save_pretrained
from bert.cli import main
from bert.errors import InputError
from bert.formats import tf_checkpoint
from bert.tokenization import FullTokenizer
from conftest import FIXTURES, HEADS, cli_error


def _same_params(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("name, kwargs", HEADS)
def test_native_round_trip_every_head(tmp_path, tiny_config, name, kwargs):
    cls = getattr(modeling, name)
    model = cls(tiny_config, **kwargs)
    model.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"model.safetensors", "config.json", "tokenizer_config.json"}
    _same_params(model, cls.from_pretrained(tmp_path))


def test_tokenizer_settings_and_vocab_saved_with_the_model(tmp_path, tiny_config):
    model = modeling.BertModel(tiny_config)
    save_pretrained(model, tmp_path, vocab_file=FIXTURES / "tf_checkpoint" / "tiny" / "vocab.txt", do_lower_case=False)
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.tokenizer_settings["do_lower_case"] is False
    assert ckpt.vocab_file and ckpt.vocab_file.endswith("vocab.txt")
    # The settings are the tokenizer's own statement of them, plus what transformers needs to pick its class.
    own = FullTokenizer(ckpt.vocab_file, do_lower_case=False).tokenizer_config()
    assert ckpt.tokenizer_settings == {
        "tokenizer_class": "BertTokenizer",
        "model_max_length": tiny_config.max_position_embeddings,
        **own,
    }
    export_tf(model, tmp_path / "tf", do_lower_case=True)
    uncased = FullTokenizer(ckpt.vocab_file, do_lower_case=True).tokenizer_config()
    assert read_checkpoint(tmp_path / "tf" / "bert_model.ckpt").tokenizer_settings.items() >= uncased.items()


def test_encoder_checkpoint_loads_into_heads_and_back(tmp_path, tiny_config):
    pre = modeling.BertForPreTraining(tiny_config)
    pre.save_pretrained(tmp_path / "pre")
    clf = modeling.BertForSequenceClassification.from_pretrained(tmp_path / "pre", num_labels=2)
    assert torch.equal(clf.bert.encoder.layer[1].output.dense.weight, pre.bert.encoder.layer[1].output.dense.weight)
    enc = modeling.BertModel.from_pretrained(tmp_path / "pre")
    assert torch.equal(enc.pooler.dense.bias, pre.bert.pooler.dense.bias)
    enc.save_pretrained(tmp_path / "enc")
    back = modeling.BertForPreTraining.from_pretrained(tmp_path / "enc")  # heads freshly initialised
    assert torch.equal(back.bert.embeddings.word_embeddings.weight, pre.bert.embeddings.word_embeddings.weight)


def test_num_labels_read_from_the_checkpoint(tmp_path, tiny_config):
    modeling.BertForSequenceClassification(tiny_config, num_labels=5).save_pretrained(tmp_path)
    assert modeling.BertForSequenceClassification.from_pretrained(tmp_path).num_labels == 5


def test_transformers_loads_our_export_and_we_load_theirs(tmp_path, tiny_config):
    transformers = pytest.importorskip("transformers")
    ours = modeling.BertForPreTraining(tiny_config).eval()
    assert (
        main(["convert", f"--input={_saved(ours, tmp_path / 'n')}", f"--output={tmp_path / 'hf'}", "--format=hf"]) == 0
    )
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    ids = torch.randint(0, 99, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).prediction_logits, ours(ids).mlm_logits, atol=1e-5, rtol=1e-5)
    hf.save_pretrained(tmp_path / "theirs", safe_serialization=True)
    _same_params(ours, modeling.BertForPreTraining.from_pretrained(tmp_path / "theirs"))
    torch.save(hf.state_dict(), tmp_path / "theirs" / "pytorch_model.bin")
    (tmp_path / "theirs" / "model.safetensors").unlink()
    _same_params(ours, modeling.BertForPreTraining.from_pretrained(tmp_path / "theirs"))


def _saved(model, path):
    model.save_pretrained(path)
    return path


def test_legacy_gamma_beta_names_load(tmp_path, tiny_config):
    model = modeling.BertModel(tiny_config)
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in model.state_dict().items()
    }
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(tiny_config.to_json_string())
    _same_params(model, modeling.BertModel.from_pretrained(tmp_path))


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_bin_with_pickled_code_is_refused(tmp_path, tiny_config):
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"x": _Evil()}, f)
    (tmp_path / "config.json").write_text(tiny_config.to_json_string())
    with pytest.raises(InputError, match="cannot be read safely"):
        modeling.BertModel.from_pretrained(tmp_path)


def test_tf_export_round_trip_lossless_native_hf_tf_native(tmp_path, tiny_config):
    tiny_config.hidden_act = "gelu"  # the erf form must survive the original's spelling
    model = modeling.BertForPreTraining(tiny_config)
    model.save_pretrained(tmp_path / "native")
    assert main(["convert", f"--input={tmp_path / 'native'}", f"--output={tmp_path / 'hf'}", "--format=hf"]) == 0
    assert main(["convert", f"--input={tmp_path / 'hf'}", f"--output={tmp_path / 'tf'}", "--format=tf"]) == 0
    assert (tmp_path / "tf" / "bert_model.ckpt.index").is_file()
    original = json.loads((tmp_path / "tf" / "bert_config.json").read_text())
    assert original["hidden_act"] == "gelu" and "model_type" not in original
    assert main(["convert", f"--input={tmp_path / 'tf'}", f"--output={tmp_path / 'back'}", "--format=native"]) == 0
    back = modeling.BertForPreTraining.from_pretrained(tmp_path / "back")
    assert back.config.hidden_act == "gelu"
    _same_params(model, back)


def test_tf_export_of_fixture_reads_back_the_same_variables(tmp_path):
    src = FIXTURES / "tf_checkpoint" / "tiny_weights_only"
    model = modeling.BertForPreTraining.from_pretrained(src)
    export_tf(model, tmp_path)
    a, b = (
        tf_checkpoint.load_variables(str(src / "bert_model.ckpt")),
        tf_checkpoint.load_variables(str(tmp_path / "bert_model.ckpt")),
    )
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), k


def test_errors_name_the_file_and_the_fix(tmp_path, tiny_config):
    with pytest.raises(InputError, match="does not exist"):
        read_checkpoint(tmp_path / "nothing_here.safetensors")
    model = modeling.BertModel(tiny_config)
    model.save_pretrained(tmp_path / "ok")
    # truncated weights
    (tmp_path / "trunc").mkdir()
    data = (tmp_path / "ok" / "model.safetensors").read_bytes()
    (tmp_path / "trunc" / "model.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "trunc" / "config.json").write_text(tiny_config.to_json_string())
    with pytest.raises(InputError, match="truncated"):
        modeling.BertModel.from_pretrained(tmp_path / "trunc")
    # shape mismatch: a config with another hidden size
    other = tiny_config.to_dict()
    other.update(hidden_size=16, num_attention_heads=2)
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(InputError, match="hidden_size=16, but .*word_embeddings.weight in .* has 32"):
        modeling.BertModel.from_pretrained(
            tmp_path / "ok", config=type(tiny_config).from_json_file(tmp_path / "other.json")
        )
    # more layers in the config than in the checkpoint
    deeper = type(tiny_config).from_dict({**tiny_config.to_dict(), "num_hidden_layers": 3})
    with pytest.raises(InputError, match="num_hidden_layers=3, but .* holds 2 layers"):
        modeling.BertModel.from_pretrained(tmp_path / "ok", config=deeper)
    # no config anywhere
    (tmp_path / "ok" / "config.json").unlink()
    with pytest.raises(InputError, match="pass --bert_config_file"):
        modeling.BertModel.from_pretrained(tmp_path / "ok")


def test_convert_cli_bad_input_exit_2(tmp_path, capsys):
    assert main(["convert", f"--input={tmp_path / 'missing'}", f"--output={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bert convert: error:") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_directory_without_a_model_names_every_layout_looked_for_and_what_it_holds(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "runs").mkdir()
    with pytest.raises(InputError) as e:
        read_checkpoint(tmp_path)
    message = str(e.value)
    for looked_for in ("model.safetensors", "pytorch_model.bin", "transformers", "sentence-transformers", "TF"):
        assert looked_for in message, looked_for
    assert "it holds notes.txt, runs/" in message
    line = cli_error(capsys, "predict", f"--model={tmp_path}", "--input_file=x")
    assert f"no model in {tmp_path}: looked for" in line
