#!/usr/bin/env bash
# The one prepared GPU benchmark for diffill (an H200 lent through the device tool).
#
#   scripts/gpu_bench.sh --fetch-wheels  # HERE, once: wheels the GPU image lacks -> .whl/
#   scripts/gpu_bench.sh                 # ON THE GPU: everything below, results under $OUT
#   scripts/gpu_bench.sh --cpu           # the same flow with tiny shapes on CPU (script check)
#
# Device call (from the repo root; .whl must be listed in .git/info/exclude and carried):
#   run(command="bash scripts/gpu_bench.sh", carry=[".whl"], timeout_s=500)
#
# What it does (GPU mode; steps past DEADLINE=420 s are skipped, in priority order):
#   0. environment: nvidia-smi, torch/triton versions, flash-attn importable or not
#   1. correctness on the device: tests/gpu (Triton kernels at real vocabulary sizes, bf16) and
#      the kernel/cache/AR/engine unit tests (the kernel tests run on CUDA in-process)
#   2. diffill bench for Qwen2.5-0.5B / 1.5B / 7B shapes (random weights, bf16): context 1024,
#      holes 16/32/64, steps 1-16, without and with the dual cache (refresh 4), the AR baseline,
#      copy-bandwidth and matmul floors, select-and-unmask torch vs Triton; 1.5B also: CUDA
#      graphs on/off, SDPA vs the math reference (flash-attn too when importable), the step
#      plan for a 25 ms budget and a torch.profiler trace of one infill
#   3. everything packed into $OUT/gpu_bench.tar.gz (JSON, PNG, trace, logs) plus
#      $OUT/summary.txt (the tables) and $OUT/log.txt -- 3 files, within the device limits.
# Nothing is downloaded at run time: only wheels carried in .whl/ are installed (offline).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODE=gpu
case "${1:-}" in
  --cpu) MODE=cpu ;;
  --fetch-wheels) MODE=fetch ;;
  "") ;;
  *) echo "usage: $0 [--cpu | --fetch-wheels]" >&2; exit 2 ;;
esac

# seconds after start past which steps are skipped, so that packing always happens
if [ "$MODE" = cpu ]; then DEADLINE=${DEADLINE:-1500}; else DEADLINE=${DEADLINE:-420}; fi

if [ "$MODE" = fetch ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  PY=${PYTHON:-python3}
  exec "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    msgspec==0.23.0 pygls==2.1.1 lsprotocol==2025.0.0 cattrs==26.2.1
fi

OUT=${OUT:-/tmp/diffill_gpu_bench}
RUN="$OUT/run"
rm -rf "$RUN"
mkdir -p "$RUN"
LOG="$OUT/log.txt"
: > "$LOG"
export PYTHONUNBUFFERED=1
if [ "$MODE" = cpu ]; then
  PY=${PYTHON:-$(command -v /work/venv/bin/python || command -v python3)}
else
  PY=${PYTHON:-python3}
fi
say() { echo "== $*" | tee -a "$LOG"; }
step() {  # step NAME TIMEOUT CMD... : run with a time limit, log, never abort the script
  local name=$1 limit=$2; shift 2
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    say "$name: SKIPPED (script deadline ${DEADLINE}s reached)"; return 0
  fi
  [ $((SECONDS + limit)) -gt "$DEADLINE" ] && limit=$((DEADLINE - SECONDS + 20))
  say "$name (limit ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$RUN/$name.out" 2>&1
  local rc=$?
  tail -n 40 "$RUN/$name.out" >> "$LOG"
  say "$name: rc=$rc in $((SECONDS - t0)) s"
  return 0
}

# -- environment: carried wheels, and `diffill` importable without installing it -------------
SHIM=/tmp/diffill_shim
. scripts/gpu_env.sh
DIFFILL=("$PY" -m diffill.cli)

say "mode $MODE, python $PY, out $OUT"
{
  date -u
  [ "$MODE" = gpu ] && nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
  "$PY" - <<'EOF'
import importlib, torch, diffill, diffill.model
print("diffill from", diffill.__file__, "version", diffill.__version__)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
for m in ("triton", "flash_attn", "msgspec", "pygls"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(m, "NOT importable:", type(e).__name__, e)
from diffill.model.attention import HAVE_FLASH
print("attention: flash-attn", "available" if HAVE_FLASH else "not available (SDPA)")
EOF
} >>"$LOG" 2>&1
tail -n 12 "$LOG"

# -- shapes per mode -----------------------------------------------------------------------------
if [ "$MODE" = gpu ]; then
  DEV=cuda; MODELS=(qwen2.5-1.5b qwen2.5-0.5b qwen2.5-7b); MAIN=qwen2.5-1.5b
  CTX=(1024); HOLES=(16 32 64); STEPS=(1 2 4 8 16); REPEATS=8; FLOOR=()
  ATTN_HOLES=(32); ATTN_STEPS=(1 8); PLAN_CTX=(256 512 1024 2048); PLAN_HOLES=(8 16 32 64)
  TLIM_TEST=180; TLIM_SMALL=90; TLIM_BIG=150
else
  DEV=cpu; MODELS=(tiny default-shape); MAIN=tiny
  CTX=(64); HOLES=(8); STEPS=(1 2); REPEATS=2; FLOOR=(--quick --threads 1)
  ATTN_HOLES=(8); ATTN_STEPS=(1 2); PLAN_CTX=(64); PLAN_HOLES=(8)
  TLIM_TEST=600; TLIM_SMALL=300; TLIM_BIG=300
fi
COMMON=(--device "$DEV" --ctx "${CTX[@]}" --holes "${HOLES[@]}" --steps "${STEPS[@]}"
        --repeats "$REPEATS")

# -- 1. correctness on the device ---------------------------------------------------------------
if [ "$MODE" = gpu ]; then
  step tests "$TLIM_TEST" "$PY" -m pytest -q -p no:cacheprovider -x tests/gpu \
    tests/unit/kernels/test_select_unmask.py tests/unit/model/test_cache.py tests/unit/evaluation/test_ar.py \
    tests/unit/model/test_plan.py
else
  step tests "$TLIM_TEST" "$PY" -m pytest -q -p no:cacheprovider -x tests/gpu \
    tests/unit/model/test_cache.py tests/unit/evaluation/test_ar.py
fi

# -- 2. benchmarks (priority order: the main model, its graphs run, the other sizes, extras) ----
bench_model() {
  local m=$1 lim=$TLIM_SMALL extra=()
  [ "$m" = qwen2.5-7b ] && lim=$TLIM_BIG
  [ "$m" = "$MAIN" ] && extra=(--profile "$RUN/trace_$m.json" --plan --budget-ms 25)
  step "bench_$m" "$lim" "${DIFFILL[@]}" bench --model "$m" "${COMMON[@]}" "${FLOOR[@]}" \
    --refresh 0 4 --select auto --kernel-bench --json "$RUN/bench_$m.json" \
    --plot "$RUN/bench_$m.png" "${extra[@]}"
}
bench_model "$MAIN"
# CUDA graphs (engine flag) on the main model, same grid, with and without the cache
step "graphs_$MAIN" "$TLIM_SMALL" "${DIFFILL[@]}" bench --model "$MAIN" "${COMMON[@]}" "${FLOOR[@]}" \
  --refresh 0 4 --select auto --graphs --no-ar --no-floors --json "$RUN/graphs_$MAIN.json"
for m in "${MODELS[@]}"; do
  [ "$m" = "$MAIN" ] || bench_model "$m"
done
# the plain torch step (no fused select) on the main model, for the kernel's end-to-end effect
step "torchstep_$MAIN" "$TLIM_SMALL" "${DIFFILL[@]}" bench --model "$MAIN" "${COMMON[@]}" "${FLOOR[@]}" \
  --refresh 0 --no-ar --no-floors --json "$RUN/torchstep_$MAIN.json"
# attention backends on the main model (flash only where flash-attn imports)
for a in sdpa math flash; do
  step "attn_${a}_$MAIN" "$TLIM_SMALL" "${DIFFILL[@]}" bench --model "$MAIN" --device "$DEV" \
    --ctx "${CTX[@]}" --holes "${ATTN_HOLES[@]}" --steps "${ATTN_STEPS[@]}" --repeats "$REPEATS" \
    --refresh 0 --attention "$a" --no-ar --no-floors --json "$RUN/attn_${a}_$MAIN.json"
done

# -- 3. pack ---------------------------------------------------------------------------------------
{
  echo "diffill GPU bench ($MODE) $(date -u)"
  for f in "$RUN"/bench_*.out "$RUN"/graphs_*.out "$RUN"/torchstep_*.out "$RUN"/attn_*.out; do
    [ -f "$f" ] || continue
    echo; echo "### $(basename "$f" .out)"; grep -v '^\[bench\]' "$f" | tail -n 60
  done
  echo; echo "### tests"; tail -n 5 "$RUN/tests.out"
} > "$OUT/summary.txt"
tar czf "$OUT/gpu_bench.tar.gz" -C "$RUN" .
rm -rf "$RUN"
say "done: $OUT/summary.txt $OUT/gpu_bench.tar.gz $OUT/log.txt"
cat "$OUT/summary.txt"
