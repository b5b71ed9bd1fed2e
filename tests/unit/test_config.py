import json

import pytest

from bert.config import BertConfig, named_config, resolve_config
from bert.errors import InputError

ORIGINAL = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "type_vocab_size": 2,
    "vocab_size": 30522,
}


def test_original_json_gelu_is_tanh_and_defaults_follow_the_original(tmp_path):
    path = tmp_path / "bert_config.json"
    d = dict(ORIGINAL)
    del d["type_vocab_size"]
    path.write_text(json.dumps(d))
    config = BertConfig.from_json_file(path)
    assert config.hidden_act == "gelu_new" and config.gelu_form == "tanh"
    assert config.type_vocab_size == 16  # the original class default when the key is missing
    assert BertConfig.from_dict(ORIGINAL, original_gelu="erf").gelu_form == "erf"


def test_hf_json_keeps_hf_meaning_and_extras_round_trip():
    hf = dict(ORIGINAL, model_type="bert", hidden_act="gelu", architectures=["BertForMaskedLM"], id2label={"0": "a"})
    config = BertConfig.from_dict(hf)
    assert config.gelu_form == "erf"
    again = BertConfig.from_dict(json.loads(config.to_json_string()))
    assert again == config
    assert again.extra["id2label"] == {"0": "a"}


def test_multilingual_pooler_keys_preserved():
    d = dict(ORIGINAL, directionality="bidi", pooler_fc_size=768, pooler_type="first_token_transform")
    config = BertConfig.from_dict(d)
    out = json.loads(config.to_json_string())
    assert out["pooler_type"] == "first_token_transform" and out["directionality"] == "bidi"


def test_written_file_is_the_superset_sorted_with_newline():
    text = BertConfig(vocab_size=99, hidden_size=37, num_attention_heads=1).to_json_string()
    assert text.endswith("}\n")
    d = json.loads(text)
    assert list(d) == sorted(d)
    for key in ORIGINAL:
        assert key in d
    assert d["model_type"] == "bert" and d["layer_norm_eps"] == 1e-12


def test_original_export_spelling_round_trips_both_gelu_forms():
    for act in ("gelu", "gelu_new"):
        config = BertConfig(vocab_size=99, hidden_act=act)
        d = json.loads(config.to_original_json_string())
        assert d["hidden_act"] == "gelu"
        assert BertConfig.from_dict(d).hidden_act == ("gelu" if act == "gelu" else "gelu_new")


def test_transformers_loads_our_file(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = BertConfig(vocab_size=99, hidden_size=32, num_attention_heads=4, hidden_act="gelu_new")
    (tmp_path / "config.json").write_text(config.to_json_string())
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    assert hf.hidden_act == "gelu_new" and hf.vocab_size == 99 and hf.layer_norm_eps == 1e-12


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"hidden_size": 30}, "multiple of num_attention_heads"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"is_decoder": True}, "is_decoder"),
        ({"vocab_size": None}, "vocab_size"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
    ],
)
def test_settings_we_cannot_honour_are_refused(change, fragment):
    with pytest.raises(InputError, match=fragment):
        BertConfig.from_dict(dict(ORIGINAL, model_type="bert", **change))


def test_unreadable_and_invalid_files_name_the_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        BertConfig.from_json_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(InputError, match=r"bad.json:1: not valid JSON \("):
        BertConfig.from_json_file(bad)


def test_named_shapes():
    mini = named_config("mini", vocab_size=1000)
    assert (mini.num_hidden_layers, mini.hidden_size, mini.num_attention_heads, mini.intermediate_size) == (
        4,
        256,
        4,
        1024,
    )
    assert named_config("L-6_H-512").num_attention_heads == 8
    assert named_config("large").num_attention_heads == 16
    assert resolve_config("base").hidden_size == 768
    with pytest.raises(InputError, match="unknown model shape"):
        named_config("huge")


def test_vocab_larger_than_config_is_refused():
    with pytest.raises(InputError, match="vocab file v.txt has 120 entries but the config's vocab_size is 99"):
        BertConfig(vocab_size=99).validate_vocab(120, "v.txt")
