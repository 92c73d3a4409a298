#!/usr/bin/env bash
# The prepared GPU training run of the default model (one device call, ~9 minutes).
#
#   scripts/gpu_train.sh --pack DATA_DIR   # HERE, once: token folder + tokenizer -> data/gpu_train.tar.xz
#   scripts/gpu_train.sh                   # ON THE GPU: both phases, results under $OUT
#   scripts/gpu_train.sh --cpu             # the same flow with tiny shapes on CPU (script check)
#
# Device call (repo root; data/ is git-ignored, so it must be carried; .whl from
# `scripts/gpu_bench.sh --fetch-wheels` brings msgspec, which the CUDA image lacks):
#   run(command="bash scripts/gpu_train.sh", carry=["data/gpu_train.tar.xz", ".whl"], timeout_s=590)
#
# What it does (the CPU recipe of BENCHMARKS.md, scaled up):
#   1. unpack the pre-tokenised corpus (train/heldout .bin + .idx.npy, meta.json, tokenizer.json);
#   2. phase 1, causal warm start: --objective ar --shift-logits (AR_MIN minutes);
#   3. phase 2, masked diffusion from it: --init-from phase 1 --shift-logits (MDM_MIN minutes);
#      batches are cut by DATA_WORKERS processes (one Python process makes ~0.3-0.5M tok/s);
#   4. $OUT: the final checkpoint (config.json, tokenizer.json, model.safetensors split into
#      15 MiB parts: the device returns files of at most 16 MiB), both phases' log.jsonl, log.txt.
#      Reassemble here:  cat model.safetensors.part-* > model.safetensors
# Then evaluate HERE (CPU) with `diffill eval --model <folder>` and ship it if it wins.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODE=gpu
case "${1:-}" in
  --cpu) MODE=cpu ;;
  --pack) MODE=pack ;;
  "") ;;
  *) echo "usage: $0 [--cpu | --pack DATA_DIR]" >&2; exit 2 ;;
esac

if [ "$MODE" = pack ]; then
  SRC=${2:?--pack needs the token folder (train.bin, heldout.bin, *.idx.npy, meta.json)}
  TOKJ=${TOKENIZER:-$(dirname "$SRC")/tokenizer/tokenizer.json}
  mkdir -p data
  STAGE=$(mktemp -d)
  cp "$SRC"/train.bin "$SRC"/train.idx.npy "$SRC"/heldout.bin "$SRC"/heldout.idx.npy "$SRC"/meta.json "$STAGE"/
  cp "$TOKJ" "$STAGE"/tokenizer.json
  tar -C "$STAGE" -cf - . | xz -T0 -6 > data/gpu_train.tar.xz
  rm -rf "$STAGE"
  ls -la data/gpu_train.tar.xz
  exit 0
fi

OUT=${OUT:-/tmp/diffill_gpu_train}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: > "$LOG"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
say() { echo "== $*" | tee -a "$LOG"; }
if [ "$MODE" = cpu ]; then
  PY=${PYTHON:-$(command -v /work/venv/bin/python || command -v python3)}
else
  PY=${PYTHON:-python3}
fi

# -- environment: carried wheels, `diffill` importable without installing it ---------------------
SHIM=/tmp/diffill_train_shim
. scripts/gpu_env.sh

# -- data ----------------------------------------------------------------------------------------
DATA=/tmp/diffill_train_data
if [ ! -f "$DATA/train.bin" ]; then
  [ -f data/gpu_train.tar.xz ] || { say "data/gpu_train.tar.xz missing (run --pack here)"; exit 1; }
  rm -rf "$DATA"; mkdir -p "$DATA"
  xz -dc data/gpu_train.tar.xz | tar -C "$DATA" -xf - || { say "unpack failed"; exit 1; }
fi
{ date -u; [ "$MODE" = gpu ] && nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; ls -la "$DATA"; } >>"$LOG" 2>&1

# -- shapes per mode -----------------------------------------------------------------------------
if [ "$MODE" = gpu ]; then
  # 15.7M parameters: ships as bf16 (31 MB) under the 60 MB limit
  SHAPE=(--d-model 384 --layers 8 --heads 6 --kv-heads 2 --ffn 1024 --seq-len 512)
  RUNCFG=(--device cuda --bf16 --data-workers ${DATA_WORKERS:-12} --batch-tokens 131072
          --eval-batches 8 --eval-every-min 1 --save-every-min 2 --log-every 20 --no-progress)
  AR_LIMIT=(--max-time-min ${AR_MIN:-3.5}); MDM_LIMIT=(--max-time-min ${MDM_MIN:-4.0})
  AR_LR=(--lr 2e-3 --min-lr-ratio 0.3 --warmup 100); MDM_LR=(--lr 1.5e-3 --warmup 100)
else
  SHAPE=(--d-model 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64 --seq-len 128)
  RUNCFG=(--device cpu --threads 1 --data-workers 2 --batch-tokens 1024 --eval-batches 1
          --eval-every-min 0 --save-every-min 0 --log-every 5 --no-progress)
  AR_LIMIT=(--max-steps 10); MDM_LIMIT=(--max-steps 10)
  AR_LR=(--lr 3e-3 --warmup 2); MDM_LR=(--lr 2e-3 --warmup 2)
fi
RUNS=$OUT/runs
rm -rf "$RUNS"
COMMON=(--data "$DATA" --tokenizer "$DATA/tokenizer.json" "${SHAPE[@]}" "${RUNCFG[@]}" --seed 0)

say "phase 1: causal warm start"
"$PY" -m diffill.training.train "${COMMON[@]}" --out "$RUNS/ar" --objective ar --shift-logits \
  --fim-ratio 0 "${AR_LR[@]}" "${AR_LIMIT[@]}" >>"$LOG" 2>&1
rc1=$?; say "phase 1 rc=$rc1"; tail -n 3 "$RUNS/ar/log.jsonl" >>"$LOG" 2>/dev/null
[ -e "$RUNS/ar/latest" ] || { say "phase 1 left no checkpoint"; exit 1; }

say "phase 2: masked diffusion from phase 1"
"$PY" -m diffill.training.train "${COMMON[@]}" --out "$RUNS/mdm" --init-from "$RUNS/ar/latest" \
  --shift-logits --fim-ratio 0.7 "${MDM_LR[@]}" "${MDM_LIMIT[@]}" >>"$LOG" 2>&1
rc2=$?; say "phase 2 rc=$rc2"; tail -n 3 "$RUNS/mdm/log.jsonl" >>"$LOG" 2>/dev/null
FINAL=$(readlink -f "$RUNS/mdm/latest" 2>/dev/null || readlink -f "$RUNS/ar/latest")

# -- results: at most 8 files of at most 16 MiB ----------------------------------------------------
cp "$FINAL/config.json" "$FINAL/tokenizer.json" "$OUT"/
split -b 15M -d -a 1 "$FINAL/model.safetensors" "$OUT/model.safetensors.part-"
cat "$RUNS/ar/log.jsonl" > "$OUT/log_ar.jsonl"
cat "$RUNS/mdm/log.jsonl" > "$OUT/log_mdm.jsonl" 2>/dev/null
rm -rf "$RUNS"
say "done ($FINAL)"; ls -la "$OUT" | tee -a "$LOG"
