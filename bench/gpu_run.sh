#!/usr/bin/env bash
# The GPU figures in one run of under 8 minutes (a lent machine's time is short): the CUDA tests, BERT-Base
# pre-training rows against transformers (eager, gradient checkpointing, compiled) with `--plan` beside them,
# embedding throughput against transformers and sentence-transformers, `bert serve` at 1 and 64 clients, and a
# BERT-Small pre-training on the books within a time budget, its model brought back in bfloat16. Later leases
# choose their sections by SECTIONS (a space-separated list; default the first run's: "tests pretrain embed serve
# small compiled"): "profile" traces eager and compiled pre-training steps (bench/gpu_profile.py), "grid" runs the
# small-BERT release's 20-run grid of a distilled MRPC student (bench/gpu_distill_grid.py; needs MINILM, a copy of
# all-MiniLM-L6-v2, default .gpu/minilm, and GLUE, default $DATA/glue).
#
#   bash bench/gpu_run.sh OUT_DIR [SECONDS]
#   SECTIONS="tests profile grid" bash bench/gpu_run.sh OUT_DIR 420
#
# Needs, beside the repo: DATA (default .gpu/data: vocab/uncased.txt and glue/*/dev.tsv, laid out as the shared
# data folder), CORPUS and HELDOUT (default .gpu/corpus.txt.gz and .gpu/heldout.txt.gz: `bert prepare-corpus`
# output of the shared books, Chesterton's "The Man Who Was Thursday" held out) and, where the serve extra is not
# installed, its wheels in WHEELS (default .gpu/whl). Every section has a time limit inside one deadline
# (SECONDS, default 470), runs even if one before it failed, and packs what it wrote into
# OUT_DIR/results.tar.gz as it ends, so a cut run still returns the sections that finished.
set -uo pipefail
OUT=${1:?usage: bash bench/gpu_run.sh OUT_DIR [SECONDS]}
DEADLINE=$((SECONDS + ${2:-470}))
DATA=${DATA:-.gpu/data}
CORPUS=${CORPUS:-.gpu/corpus.txt.gz}
HELDOUT=${HELDOUT:-.gpu/heldout.txt.gz}
WHEELS=${WHEELS:-.gpu/whl}
MINILM=${MINILM:-.gpu/minilm}
GLUE=${GLUE:-$DATA/glue}
SECTIONS=" ${SECTIONS:-tests pretrain embed serve small compiled} "
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10
PY=${PYTHON:-python3}
# QUICK=1: the CPU smoke test of this script (tiny shapes, a few steps, the serve bench on the CPU).
QUICK_FLAG=() SERVE_DEVICE=(--device cuda --dtype bfloat16) SERVE_MODEL=minilm
[ -n "${QUICK:-}" ] && QUICK_FLAG=(--quick --device cpu) SERVE_DEVICE=(--device cpu) SERVE_MODEL=tiny

pack() { tar -czf "$OUT/results.tar.gz.tmp" -C "$WORK" --exclude=models --exclude='*_data' \
  --exclude='checkpoint-*' --exclude='model' --exclude='*.safetensors' . && mv "$OUT/results.tar.gz.tmp" "$OUT/results.tar.gz"; }
want() { [[ $SECTIONS == *" $1 "* ]]; }
# section NAME LIMIT COMMAND...: run with the smaller of LIMIT and the time left (minus 15 s to pack).
section() {
  local name=$1 limit=$2 left=$((DEADLINE - SECONDS - 15)) t0=$SECONDS
  shift 2
  ((left < limit)) && limit=$left
  if ((limit < 10)); then echo "== $name: skipped, no time left"; return; fi
  echo "== $name (limit ${limit} s, $(date +%T))"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$WORK/$name.log"
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  pack
}

{
  date -u
  nvidia-smi
  "$PY" -c "import sys, torch, transformers, sentence_transformers as st; print(sys.version); print('torch', torch.__version__, 'transformers', transformers.__version__, 'sentence-transformers', st.__version__)"
} >"$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt"
if ! "$PY" -c "import starlette, uvicorn" 2>/dev/null && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl &&
    export PYTHONPATH="$PYTHONPATH:$WORK/site"
fi

# The pre-training data is made on the CPUs while the GPU sections run.
if want small; then
  "$PY" bench/gpu_small_pretrain.py --data_only --corpus "$CORPUS" --heldout "$HELDOUT" \
    --vocab "$DATA/vocab/uncased.txt" --out "$WORK/small" --num_workers 8 ${QUICK:+--quick} >"$WORK/small_data.log" 2>&1 &
  data_pid=$!
fi

want tests && section pytest_gpu 45 "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_cuda.py
want profile && section profile 150 "$PY" bench/gpu_profile.py "${QUICK_FLAG[@]}" --out "$WORK/profile"
want pretrain && section pretrain_eager 70 "$PY" bench/gpu.py "${QUICK_FLAG[@]}" --sections pretrain --measure-peak --data_dir "$DATA" --out "$WORK/gpu"
want embed && section embed 60 "$PY" bench/gpu_inference.py "${QUICK_FLAG[@]}" --data_dir "$DATA" --model_root "$WORK/models" --out "$WORK/embed"
want serve && section serve 75 "$PY" bench/serve.py "${SERVE_DEVICE[@]}" --levels 1,64 --model "$WORK/models/$SERVE_MODEL" \
  --requests 4000 --seconds 6 --threads 4 --data "$DATA/glue/SST-2/dev.tsv"
want grid && section grid 300 "$PY" bench/gpu_distill_grid.py --minilm "$MINILM" --glue "$GLUE" --out "$WORK/grid" \
  --grid_jobs 4 ${QUICK:+--quick}
if want small; then
  wait "$data_pid"
  echo "== pre-training data: exit $? ($(tail -n 1 "$WORK/small_data.log"))"
  section small_pretrain 170 "$PY" bench/gpu_small_pretrain.py --corpus "$CORPUS" --heldout "$HELDOUT" \
    --vocab "$DATA/vocab/uncased.txt" --out "$WORK/small" --seconds 85 ${QUICK:+--quick}
  # The model back in bfloat16 (half the bytes), cut into parts under the 16 MB a returned file may have.
  model="$WORK/small/pretrain/model"
  if [ -f "$model/model.safetensors" ]; then
    "$PY" -c "
import sys, torch
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}, sys.argv[2])
" "$model/model.safetensors" "$WORK/small_model.bf16.safetensors" &&
      split -b 15m -d "$WORK/small_model.bf16.safetensors" "$OUT/small_model.bf16.safetensors.part" &&
      cp "$model/config.json" "$WORK/small_model_config.json"
    pack
  fi
fi
want compiled && section pretrain_compiled 150 "$PY" bench/gpu.py "${QUICK_FLAG[@]}" --sections pretrain --compile --measure-peak --data_dir "$DATA" \
  --out "$WORK/gpu_compiled"
echo "== done at $(date +%T), $SECONDS s; returned: $(ls "$OUT")"
