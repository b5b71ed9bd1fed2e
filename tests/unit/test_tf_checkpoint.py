"""TF V2 checkpoints without TensorFlow: the original's tiny checkpoint, exact round trips, clear errors."""

import shutil
import struct

import numpy as np
import pytest
import torch

from bert.errors import InputError
from bert.formats import crc32c
from bert.formats.protobuf import read_varint
from bert.formats.tf_checkpoint import (
    _block_entries,
    _read_block,
    list_variables,
    load_variables,
    resolve_checkpoint_prefix,
    write_checkpoint,
)
from conftest import FIXTURES

TINY = FIXTURES / "tf_checkpoint" / "tiny"
WEIGHTS_ONLY = FIXTURES / "tf_checkpoint" / "tiny_weights_only"
DATA_NAME = "bert_model.ckpt.data-00000-of-00001"


def _weight_shapes():
    shapes = {
        "bert/embeddings/word_embeddings": (99, 32),
        "bert/embeddings/position_embeddings": (64, 32),
        "bert/embeddings/token_type_embeddings": (2, 32),
        "bert/embeddings/LayerNorm/gamma": (32,),
        "bert/embeddings/LayerNorm/beta": (32,),
        "bert/pooler/dense/kernel": (32, 32),
        "bert/pooler/dense/bias": (32,),
        "cls/predictions/transform/dense/kernel": (32, 32),
        "cls/predictions/transform/dense/bias": (32,),
        "cls/predictions/transform/LayerNorm/gamma": (32,),
        "cls/predictions/transform/LayerNorm/beta": (32,),
        "cls/predictions/output_bias": (99,),
        "cls/seq_relationship/output_weights": (2, 32),
        "cls/seq_relationship/output_bias": (2,),
    }
    for n in range(2):
        layer = f"bert/encoder/layer_{n}"
        for part in ("self/query", "self/key", "self/value", "output/dense"):
            shapes[f"{layer}/attention/{part}/kernel"] = (32, 32)
            shapes[f"{layer}/attention/{part}/bias"] = (32,)
        shapes[f"{layer}/intermediate/dense/kernel"] = (32, 37)
        shapes[f"{layer}/intermediate/dense/bias"] = (37,)
        shapes[f"{layer}/output/dense/kernel"] = (37, 32)
        shapes[f"{layer}/output/dense/bias"] = (32,)
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            shapes[f"{layer}/{ln}/gamma"] = (32,)
            shapes[f"{layer}/{ln}/beta"] = (32,)
    return shapes


def _copy(src, dst):
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    return dst


# ----------------------------------------------------------------------------------- the original's files


def test_inventory_of_the_tiny_pretraining_checkpoint():
    variables = list_variables(TINY)
    weights = _weight_shapes()
    assert len(weights) == 46
    assert len(variables) == 139
    assert variables["global_step"] == ("int64", ())
    for name, shape in weights.items():
        assert variables[name] == ("float32", shape), name
        assert variables[f"{name}/adam_m"] == ("float32", shape)
        assert variables[f"{name}/adam_v"] == ("float32", shape)
    assert list(variables) == sorted(variables)
    assert list_variables(WEIGHTS_ONLY) == {name: ("float32", shape) for name, shape in sorted(weights.items())}


def test_weights_are_identical_in_both_checkpoints():
    full = load_variables(TINY)
    weights = load_variables(WEIGHTS_ONLY)
    assert full["global_step"].dtype == np.int64 and full["global_step"].shape == ()
    assert int(full["global_step"]) == 3
    assert len(weights) == 46
    for name, value in weights.items():
        assert value.dtype == np.float32 and value.shape == _weight_shapes()[name]
        assert np.array_equal(value, full[name]), name
        assert value.std() > 0.01  # re-randomised, not a constant initialiser
    some = load_variables(TINY, names=["cls/predictions/output_bias", "global_step"])
    assert list(some) == ["cls/predictions/output_bias", "global_step"]
    assert np.array_equal(some["cls/predictions/output_bias"], weights["cls/predictions/output_bias"])


def test_every_way_of_naming_the_checkpoint(tmp_path):
    prefix = str(WEIGHTS_ONLY / "bert_model.ckpt")
    for form in [WEIGHTS_ONLY, str(WEIGHTS_ONLY), prefix, prefix + ".index", str(WEIGHTS_ONLY / DATA_NAME)]:
        assert resolve_checkpoint_prefix(form) == prefix
    names = list(load_variables(prefix + ".index"))
    assert names == list(load_variables(WEIGHTS_ONLY / DATA_NAME)) == list(list_variables(WEIGHTS_ONLY))

    # A directory without a `checkpoint` file and one checkpoint in it.
    bare = _copy(WEIGHTS_ONLY, tmp_path / "bare")
    (bare / "checkpoint").unlink()
    assert resolve_checkpoint_prefix(bare) == str(bare / "bert_model.ckpt")
    # The `checkpoint` file may hold an absolute path from the machine that wrote it.
    (bare / "checkpoint").write_text('model_checkpoint_path: "/elsewhere/run/bert_model.ckpt"\n')
    assert resolve_checkpoint_prefix(bare) == str(bare / "bert_model.ckpt")
    # Two checkpoints and no `checkpoint` file: ambiguous.
    (bare / "checkpoint").unlink()
    shutil.copy(bare / "bert_model.ckpt.index", bare / "model.ckpt-5.index")
    with pytest.raises(InputError, match="several checkpoints"):
        resolve_checkpoint_prefix(bare)


# ------------------------------------------------------------------------------------------------- writing


@pytest.mark.parametrize("src", [TINY, WEIGHTS_ONLY], ids=["tiny", "weights_only"])
def test_writer_reproduces_tensorflows_files_byte_for_byte(src, tmp_path):
    prefix = write_checkpoint(tmp_path / "bert_model.ckpt", load_variables(src))
    assert (tmp_path / "bert_model.ckpt.index").read_bytes() == (src / "bert_model.ckpt.index").read_bytes()
    assert (tmp_path / DATA_NAME).read_bytes() == (src / DATA_NAME).read_bytes()
    assert (tmp_path / "checkpoint").read_text() == (src / "checkpoint").read_text()
    assert resolve_checkpoint_prefix(tmp_path) == prefix


def test_round_trip_of_dtypes_and_odd_shapes(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "f64": rng.standard_normal((2, 1, 3)),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "i16": np.array([-32768, 32767], dtype=np.int16),
        "i32": np.array([[1, -2], [3, -4]], dtype=np.int32),
        "i64": np.array([2**62, -(2**63)], dtype=np.int64),
        "u8": np.arange(7, dtype=np.uint8),
        "u16": np.array([65535], dtype=np.uint16),
        "u32": np.array([2**32 - 1], dtype=np.uint32),
        "u64": np.array([2**64 - 1], dtype=np.uint64),
        "bool": np.array([True, False, True]),
        "c64": np.array([1 + 2j], dtype=np.complex64),
        "scalar": np.float32(2.5),
        "scalar_int": np.int64(7),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "empty_1d": np.zeros(0, dtype=np.int32),
        "big_endian": np.array([1.5, -2.0], dtype=">f4"),
        "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not C-contiguous
        "strings": np.array([[b"abc", b""], [b"\x00\xff", "d\u00e9".encode()]], dtype=object),
        "unicode/\u00e9": np.ones(2, dtype=np.float32),
    }
    prefix = tmp_path / "sub" / "model.ckpt-12"
    write_checkpoint(prefix, tensors)
    listed = list_variables(tmp_path / "sub")
    assert listed["bool"] == ("bool", (3,)) and listed["scalar"] == ("float32", ())
    assert listed["empty"] == ("float32", (0, 3)) and listed["strings"] == ("string", (2, 2))
    back = load_variables(prefix)
    assert set(back) == set(tensors)
    for name, want in tensors.items():
        want = np.asarray(want)
        got = back[name]
        assert got.shape == want.shape, name
        if name == "strings":
            assert got.tolist() == want.tolist()
            continue
        assert got.dtype == want.dtype.newbyteorder("="), name
        assert np.array_equal(got, want), name


def test_bfloat16_is_stored_as_bfloat16_and_read_as_float32(tmp_path):
    value = torch.tensor([1.0, -2.5, 3.140625, 1e30], dtype=torch.bfloat16)
    write_checkpoint(tmp_path / "m.ckpt", {"w": value, "t32": torch.arange(3, dtype=torch.float32)})
    assert list_variables(tmp_path) == {"t32": ("float32", (3,)), "w": ("bfloat16", (4,))}
    back = load_variables(tmp_path)
    assert back["w"].dtype == np.float32
    assert back["w"].tolist() == value.float().tolist()
    assert back["t32"].tolist() == [0.0, 1.0, 2.0]
    assert (tmp_path / "m.ckpt.data-00000-of-00001").stat().st_size == 4 * 2 + 3 * 4


def test_many_variables_span_several_index_blocks(tmp_path):
    names = [f"scope_{i // 100:03d}/layer_{i:05d}/some/long/variable/name/kernel" for i in range(9000)]
    tensors = {name: np.array([i], dtype=np.int32) for i, name in enumerate(names)}
    write_checkpoint(tmp_path / "big.ckpt", tensors)
    index = (tmp_path / "big.ckpt.index").read_bytes()
    _, i = read_varint(index[-48:], 0)
    _, i = read_varint(index[-48:], i)
    index_offset, i = read_varint(index[-48:], i)
    index_size, _ = read_varint(index[-48:], i)
    separators = [key for key, _ in _block_entries(_read_block(index, index_offset, index_size))]
    assert len(separators) >= 2  # several data blocks of ~256 KiB
    assert separators == sorted(separators) and separators[-1] == b"t"  # "scope..." -> "t", as TF shortens
    back = load_variables(tmp_path)
    assert list(back) == sorted(names)
    assert all(int(back[name][0]) == i for i, name in enumerate(names))


# -------------------------------------------------------------------------------------------------- errors


def _one_line(err):
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_index_and_missing_data_are_named(tmp_path):
    ckpt = _copy(WEIGHTS_ONLY, tmp_path / "c")
    (ckpt / "bert_model.ckpt.index").unlink()
    with pytest.raises(InputError) as err:
        load_variables(ckpt / "bert_model.ckpt")
    assert ".index is missing" in _one_line(err)

    ckpt = _copy(WEIGHTS_ONLY, tmp_path / "d")
    (ckpt / DATA_NAME).unlink()
    assert len(list_variables(ckpt)) == 46  # listing needs only the index
    with pytest.raises(InputError) as err:
        load_variables(ckpt)
    assert f"{DATA_NAME} is missing" in _one_line(err)

    with pytest.raises(InputError, match="no TensorFlow checkpoint"):
        load_variables(tmp_path / "nothing" / "model.ckpt")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputError, match="no TensorFlow checkpoint"):
        load_variables(tmp_path / "empty_dir")


def test_truncated_data_file(tmp_path):
    ckpt = _copy(WEIGHTS_ONLY, tmp_path / "c")
    data = (ckpt / DATA_NAME).read_bytes()
    (ckpt / DATA_NAME).write_bytes(data[: len(data) - 100])
    with pytest.raises(InputError) as err:
        load_variables(ckpt)
    message = _one_line(err)
    assert "truncated" in message and str(ckpt / DATA_NAME) in message
    assert "variable cls/seq_relationship/output_weights" in message  # the last one in the file
    # Variables stored before the cut are still readable on their own.
    assert load_variables(ckpt, names=["bert/embeddings/LayerNorm/beta"])


def test_corrupted_tensor_bytes_are_a_crc_mismatch(tmp_path):
    ckpt = _copy(WEIGHTS_ONLY, tmp_path / "c")
    data = bytearray((ckpt / DATA_NAME).read_bytes())
    data[130] ^= 0x10  # inside the second variable in offset order: LayerNorm/gamma
    (ckpt / DATA_NAME).write_bytes(bytes(data))
    with pytest.raises(InputError) as err:
        load_variables(ckpt)
    message = _one_line(err)
    assert message.startswith(f"checkpoint file {ckpt / DATA_NAME} is corrupt: crc mismatch for variable ")
    assert message.endswith("bert/embeddings/LayerNorm/gamma")
    changed = load_variables(ckpt, names=["bert/embeddings/LayerNorm/gamma"], verify_crc=False)
    original = load_variables(WEIGHTS_ONLY, names=["bert/embeddings/LayerNorm/gamma"])
    assert not np.array_equal(changed["bert/embeddings/LayerNorm/gamma"], original["bert/embeddings/LayerNorm/gamma"])


def test_index_that_is_not_an_sstable(tmp_path):
    ckpt = _copy(WEIGHTS_ONLY, tmp_path / "c")
    (ckpt / "bert_model.ckpt.index").write_bytes(b"this is not a table" * 10)
    with pytest.raises(InputError) as err:
        list_variables(ckpt)
    assert "not an SSTable" in _one_line(err) and "bert_model.ckpt.index" in str(err.value)


def test_corrupted_index_block(tmp_path):
    ckpt = _copy(WEIGHTS_ONLY, tmp_path / "c")
    index = bytearray((ckpt / "bert_model.ckpt.index").read_bytes())
    index[20] ^= 0x01  # inside the data block (a key)
    (ckpt / "bert_model.ckpt.index").write_bytes(bytes(index))
    with pytest.raises(InputError) as err:
        list_variables(ckpt)
    assert "is corrupt" in _one_line(err) and "crc mismatch" in str(err.value)


def test_snappy_compressed_index_is_refused_clearly(tmp_path):
    ckpt = _copy(WEIGHTS_ONLY, tmp_path / "c")
    index = bytearray((ckpt / "bert_model.ckpt.index").read_bytes())
    # The first block starts at 0; its size is in the first handle of the index block.
    footer = bytes(index[-48:])
    _, i = read_varint(footer, 0)
    _, i = read_varint(footer, i)
    index_offset, i = read_varint(footer, i)
    index_size, _ = read_varint(footer, i)
    block = bytes(index[index_offset : index_offset + index_size])
    handle = block[3 + block[1] :]  # the first index entry: shared=0, unshared, value length, key, handle
    _, j = read_varint(handle, 0)
    size, _ = read_varint(handle, j)
    index[size] = 1  # compression type: Snappy
    index[size + 1 : size + 5] = struct.pack("<I", crc32c.masked_crc32c(bytes(index[: size + 1])))
    (ckpt / "bert_model.ckpt.index").write_bytes(bytes(index))
    with pytest.raises(InputError, match="Snappy"):
        list_variables(ckpt)


def test_unknown_variable_name(tmp_path):
    with pytest.raises(InputError, match="has no variable 'bert/nope'"):
        load_variables(WEIGHTS_ONLY, names=["bert/nope"])
