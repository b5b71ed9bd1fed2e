"""What each README recipe costs on this machine: wall time and peak memory of the recipe as written, on the
real data of `../shared/data` (tests/e2e/test_readme.py runs the same recipes on small substitutes).

    python bench/recipe_costs.py [--cap 180] [--only 8,11,27] [--workdir DIR] [--json FILE]

The recipes are test_readme's (the README's bash blocks, in order, each in the same working directory, so a
recipe reads what an earlier one wrote). The variables are the README's: `$GLUE_DIR`, `$SQUAD_DIR`, `$CORPUS_DIR`
the shared data, `$MINILM_DIR` all-MiniLM-L6-v2, and `$BERT_BASE_DIR` / `$BERT_CASED_DIR` a BERT-Base of the
released shape (12 layers, hidden 768, the released vocabularies) with random weights, written by this script as
the original's `bert_model.ckpt`: time and memory depend on the shape, not on the values (its accuracies mean
nothing and are not reported). Each shortened form of the README's cost table runs after its recipe.

A recipe still running after `--cap` seconds is stopped and its cost is the time it ran plus what its last
progress bar said was left of that phase (later phases not counted, so a lower bound); its output directory then
becomes its shortened form's, so that the recipes reading it still run. Peak memory: the largest sum of the
resident sizes of the recipe's processes, sampled every 0.2 s. The load average before each recipe is printed
beside it: a figure taken beside other work is not this machine's.
"""

from __future__ import annotations

# isort: off
import bert  # noqa: F401  (before torch: the package's OpenMP default must precede libgomp's start)

# isort: on
import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "e2e")]
from test_readme import ASSIGNMENT, RECIPES, SHORTENED, recipe_inputs  # noqa: E402  (the README's recipes, parsed once)

PAGE = os.sysconf("SC_PAGE_SIZE")
# tqdm's "[elapsed<remaining," (either as M:SS or H:MM:SS); "?" while it has no rate yet.
BAR = re.compile(r"([^\r\n|]*?):?\s*\d+%\|.*?\[(\d+(?::\d\d){1,2})<(\d+(?::\d\d){1,2}|\?)")


def seconds(clock: str) -> int:
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in the group `pgid`."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # fields[0] is the state: pgrp is the 5th field of the whole line
            total += int(fields[21]) * PAGE
    return total


def workdir(work: Path) -> dict[str, str]:
    """The working directory and the README's variables, on the real data."""
    import torch

    from bert.checkpoint import export_tf
    from bert.config import named_config
    from bert.modeling import BertForPreTraining

    for name, vocab, lower in (("uncased_L-12_H-768_A-12", "uncased", True), ("cased_L-12_H-768_A-12", "cased", False)):
        if not (work / name / "bert_model.ckpt.index").exists():
            torch.manual_seed(0)
            export_tf(BertForPreTraining(named_config("base")), work / name, SHARED / "vocab" / f"{vocab}.txt", lower)
    for name in ("retrieval", "conll2003", "sample_text.txt"):
        if not (work / name).exists():
            (work / name).symlink_to(SHARED / name)
    squad = work / "squad"
    if not squad.exists():
        squad.mkdir()
        for version in ("v1.1", "v2.0"):
            with gzip.open(SHARED / "squad" / f"dev-{version}.json.gz", "rt", encoding="utf-8") as f:
                dev = json.load(f)
            (squad / f"dev-{version}.json").write_text(json.dumps(dev), encoding="utf-8")
            # SQuAD's train set is not in the shared data: its dev set stands in (cost, not accuracy), each
            # question with one answer, as a training file has.
            for qa in (qa for article in dev["data"] for p in article["paragraphs"] for qa in p["qas"]):
                qa["answers"] = qa["answers"][:1]
            (squad / f"train-{version}.json").write_text(json.dumps(dev), encoding="utf-8")
    if not (work / "sentences.txt").exists():
        recipe_inputs(work, review_sentences=872)  # all of SST-2 dev: 109 training documents of 4 sentences
    return {
        "BERT_BASE_DIR": str(work / "uncased_L-12_H-768_A-12"),
        "BERT_CASED_DIR": str(work / "cased_L-12_H-768_A-12"),
        "GLUE_DIR": str(SHARED / "glue"),
        "SQUAD_DIR": str(squad),
        "CORPUS_DIR": str(SHARED / "corpus"),
    }


def run(recipe: str, env: dict[str, str], work: Path, cap: float) -> dict:
    start = time.perf_counter()
    log = work / "recipe.stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["bash", "-c", recipe], cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        peak = 0
        while proc.poll() is None:
            peak = max(peak, group_rss(proc.pid))
            if time.perf_counter() - start > cap:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.2)
    wall = time.perf_counter() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    out = {"seconds": round(wall, 1), "peak_mb": round(peak / 2**20), "code": proc.returncode}
    if proc.returncode == -signal.SIGKILL:
        bars = [m for m in BAR.finditer(text) if m.group(3) != "?"]
        # No bar with an estimate yet (one that moves a block at a time): at least the time it ran.
        out["estimate_s"], out["phase"] = round(wall), "(no estimate: at least)"
        if bars:
            last = bars[-1]
            out["estimate_s"] = round(wall) + seconds(last.group(3))  # what ran, and what the bar has left
            out["phase"] = last.group(1).strip()[-40:]
    elif proc.returncode != 0:
        out["error"] = text.strip().splitlines()[-1][-200:] if text.strip() else ""
    return out


def show(number: int, cost: dict, load: float, recipe: str) -> None:
    shown = f"{cost['seconds']:.0f} s"
    if "estimate_s" in cost:
        shown = f"stopped at {shown}; its bar '{cost['phase']}' estimated {cost['estimate_s'] / 60:.0f} min"
    elif cost["code"] != 0:
        shown = f"FAILED ({cost['code']}): {cost.get('error', '')}"
    print(f"{number:2d} {cost['peak_mb']:>6} MB  {shown}  (load {load:.1f})  {recipe[:100]}", flush=True)


def stand_in(recipe: str, short: str, work: Path) -> None:
    """A stopped recipe's output directory becomes its shortened form's (the same model shape), so that the
    recipes reading it (`bert predict --model=mrpc_output/model`, ...) still run and are timed."""
    full, short_dir = re.findall(r"--output_dir=(\S+)", recipe), re.findall(r"--output_dir=(\S+)", short)
    if full and short_dir:
        target = work / full[-1]
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to((work / short_dir[-1]).resolve(), target_is_directory=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cap", type=float, default=180.0, help="seconds before a recipe is stopped and estimated")
    p.add_argument("--only", default=None, help="recipe numbers (as printed), comma separated; default all")
    p.add_argument("--workdir", default="bench/out/recipes", help="kept between runs: later recipes read earlier")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **workdir(work)}
    only = {int(x) for x in args.only.split(",")} if args.only else None
    shorts = dict(SHORTENED)
    results = []
    for number, recipe in enumerate(RECIPES):
        if match := ASSIGNMENT.match(recipe):  # always: later recipes read the variable
            env[match.group(1)] = subprocess.run(
                ["bash", "-c", match.group(2)], capture_output=True, text=True, env=env, check=True
            ).stdout.strip()
            continue
        if only is not None and number not in only:
            continue
        load = os.getloadavg()[0]
        cost = run(recipe, env, work, args.cap)
        show(number, cost, load, recipe)
        row = {"number": number, "recipe": recipe, "load": round(load, 2), **cost}
        if recipe in shorts:
            load = os.getloadavg()[0]
            row["shortened"] = {
                "recipe": shorts[recipe],
                "load": round(load, 2),
                **run(shorts[recipe], env, work, args.cap),
            }
            show(number, row["shortened"], load, "shortened: " + shorts[recipe])
            if "estimate_s" in cost:
                stand_in(recipe, shorts[recipe], work)
        results.append(row)
    if args.json:
        summary = {"cpu": cpu_model(), "date": time.strftime("%Y-%m-%d"), "cap_s": args.cap, "recipes": results}
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
