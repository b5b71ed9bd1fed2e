#!/usr/bin/env bash
# The real pre-training run of bench/RESULTS.md: BERT-Mini shape on the whole shared corpus, on CPU.
#   bash bench/pretrain_real_run.sh [OUT_DIR] [NUM_TRAIN_STEPS] [CONTINUE_STEPS]
# Phase 1 trains NUM_TRAIN_STEPS from scratch into OUT_DIR/pretrain. If CONTINUE_STEPS > 0, phase 2
# continues from phase 1's model into OUT_DIR/pretrain2 with a fresh warmup and schedule, a higher peak
# learning rate and another data order (--seed), as a user continuing from a checkpoint would.
# Held out for evaluation: Chesterton's "The Man Who Was Thursday" (never seen in training).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/out/real_run}
STEPS=${2:-1500}
MORE=${3:-0}
CORPUS=../shared/data/corpus
mkdir -p "$OUT"
HELD_OUT=$CORPUS/nltk_gutenberg/chesterton-thursday.txt.gz
TRAIN_FILES=$(ls $CORPUS/*/*.txt.gz | grep -v chesterton-thursday | paste -sd, -)

[ -f "$OUT/corpus.txt" ] || bert prepare-corpus --input_file="$TRAIN_FILES" --output_file="$OUT/corpus.txt" \
  --split_chapters=true --num_workers=2
[ -f "$OUT/heldout.txt" ] || bert prepare-corpus --input_file="$HELD_OUT" --output_file="$OUT/heldout.txt" \
  --split_chapters=true
VOCAB=../shared/data/vocab/uncased.txt
[ -d "$OUT/train_data" ] || bert create-pretraining-data --input_file="$OUT/corpus.txt" \
  --output_file="$OUT/train_data" --vocab_file=$VOCAB --max_seq_length=128 --max_predictions_per_seq=20 \
  --dupe_factor=5 --streaming=true
[ -d "$OUT/eval_data" ] || bert create-pretraining-data --input_file="$OUT/heldout.txt" \
  --output_file="$OUT/eval_data" --vocab_file=$VOCAB --max_seq_length=128 --max_predictions_per_seq=20 \
  --dupe_factor=1 --streaming=true --random_seed=7
bert pretrain --bert_config_file=mini --vocab_file=$VOCAB --input_file="$OUT/train_data" \
  --eval_files="$OUT/eval_data" --output_dir="$OUT/pretrain" --do_train=true --do_eval=true \
  --train_batch_size=32 --eval_batch_size=32 --max_seq_length=128 --max_predictions_per_seq=20 \
  --num_train_steps="$STEPS" --num_warmup_steps=$((STEPS / 10)) --learning_rate=3e-4 \
  --save_checkpoints_steps=300 --log_every=25 --max_eval_steps=50

[ "$MORE" -gt 0 ] || exit 0
bert pretrain --init_checkpoint="$OUT/pretrain/model" --bert_config_file="$OUT/pretrain/model/config.json" \
  --vocab_file=$VOCAB --input_file="$OUT/train_data" --eval_files="$OUT/eval_data" --output_dir="$OUT/pretrain2" \
  --do_train=true --do_eval=true --train_batch_size=32 --eval_batch_size=32 --max_seq_length=128 \
  --max_predictions_per_seq=20 --num_train_steps="$MORE" --num_warmup_steps=$((MORE / 10)) --learning_rate=5e-4 \
  --seed=2 --save_checkpoints_steps=1000 --log_every=50 --max_eval_steps=50
