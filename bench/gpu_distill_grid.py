"""The small-BERT release's whole grid of a distilled student on one GPU: how long "minutes on a GPU" is.

The release picks each small model's GLUE score from 20 runs (batch sizes 8, 16, 32, 64, 128; learning rates
3e-4, 1e-4, 5e-5, 3e-5; 4 epochs). On the project's CPU a single run of a 3-layer student on MRPC took 10-16
minutes of a shared thread (bench/RESULTS.md, "Distillation"); this runs the 20 on a GPU with the real commands:

1. the teacher: all-MiniLM-L6-v2 fine-tuned on MRPC by `bert classify` (--teacher_lr, batch 32, 3 epochs), as
   `bench/bench_distill.py` (a) makes it;
2. the grid: `bert classify --teacher=TEACHER --transfer_file=MRPC/test.tsv --distill_alpha=0.5
   --init_from_teacher_layers=0,2,4 --train_batch_size=8,16,32,64,128 --learning_rate=3e-4,1e-4,5e-5,3e-5
   --num_train_epochs=4 --grid_jobs=J`: J cells at once on the one GPU, each a process.

The model comes as a float16 copy (half the bytes of float32, to fit what a lent machine is sent; `--minilm`),
made float32 again here: the teacher starts from all-MiniLM-L6-v2's weights rounded to float16.

    PYTHONPATH=src python bench/gpu_distill_grid.py --minilm DIR --glue DIR --out OUT_DIR --grid_jobs 4
    PYTHONPATH=src python bench/gpu_distill_grid.py ... --quick      (the CPU smoke test: 64 examples, 2 cells)

Writes OUT_DIR/grid.json (each phase's seconds, the teacher's and every cell's dev accuracy) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

RELEASE_GRID = ["--train_batch_size=8,16,32,64,128", "--learning_rate=3e-4,1e-4,5e-5,3e-5", "--num_train_epochs=4"]
QUICK_GRID = ["--train_batch_size=8,16", "--learning_rate=1e-4", "--num_train_epochs=1"]


def float32_copy(src: Path, dst: Path) -> None:
    """The model directory `src` with its safetensors weights as float32."""
    if (dst / "model.safetensors").is_file():
        return
    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors"))
    state = load_file(src / "model.safetensors")
    save_file({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, dst / "model.safetensors")


def bert(argv: list[str], log: Path) -> float:
    """`python -m bert ARGV`, its output into `log`; its seconds."""
    print("$ bert", " ".join(argv), flush=True)
    start = time.perf_counter()
    with log.open("w") as f:
        subprocess.run([sys.executable, "-m", "bert", *argv], check=True, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    print(f"  {seconds:.1f} s", flush=True)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minilm", required=True, help="all-MiniLM-L6-v2's directory (float16 or float32 weights)")
    p.add_argument("--glue", required=True, help="a folder holding MRPC/{train,dev,test}.tsv")
    p.add_argument("--out", required=True)
    p.add_argument("--grid_jobs", type=int, default=4)
    p.add_argument("--teacher_lr", default="2e-5")
    p.add_argument("--quick", action="store_true", help="64 examples, 2 cells of 1 epoch (the CPU smoke test)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mrpc = Path(args.glue) / "MRPC"
    quick = ["--max_train_examples=64", "--max_eval_examples=64", "--max_seq_length=32"] if args.quick else []
    common = ["--task_name=MRPC", f"--data_dir={mrpc}", "--do_train", "--do_eval", "--eval_batch_size=64", *quick]
    if not args.quick:
        common.append("--max_seq_length=128")
    result: dict = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "seconds": {},
    }
    start = time.perf_counter()
    minilm = out / "minilm_fp32"
    float32_copy(Path(args.minilm), minilm)
    result["seconds"]["float32 copy"] = time.perf_counter() - start

    teacher = out / "teacher"
    epochs = "--num_train_epochs=1" if args.quick else "--num_train_epochs=3"
    teacher_flags = [f"--init_checkpoint={minilm}", f"--learning_rate={args.teacher_lr}", "--train_batch_size=32"]
    result["seconds"]["teacher"] = bert(
        ["classify", *common, *teacher_flags, epochs, f"--output_dir={teacher}"], out / "teacher.log"
    )
    result["teacher"] = json.loads((teacher / "eval_results.json").read_text())

    grid = out / "grid"
    students = [f"--teacher={teacher / 'model'}", f"--transfer_file={mrpc / 'test.tsv'}", "--distill_alpha=0.5"]
    students += ["--init_from_teacher_layers=0,2,4", *(QUICK_GRID if args.quick else RELEASE_GRID)]
    students += [f"--grid_jobs={args.grid_jobs}", "--seed=1", f"--output_dir={grid}"]
    result["seconds"]["grid"] = bert(["classify", *common, *students], out / "grid.log")
    result["grid"] = json.loads((grid / "grid_results.json").read_text())
    (out / "grid.json").write_text(json.dumps(result, indent=1))
    print(f"teacher: {result['teacher'].get('eval_accuracy')} in {result['seconds']['teacher']:.0f} s")
    print(f"grid ({args.grid_jobs} cells at once): {result['seconds']['grid']:.0f} s")
    print((grid / "grid_results.tsv").read_text())
    # The bulky outputs stay behind: checkpoints and models are not brought back.
    for path in (minilm, teacher / "model", grid / "model", *grid.glob("grid/*/model"), *out.rglob("checkpoint-*")):
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
