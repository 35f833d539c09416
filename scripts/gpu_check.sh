#!/usr/bin/env bash
# The GPU check in one script: what does one GPU demand, what does the loader supply, and how many
# workers keep the GPU fed, with the tier made in the workers (the dataset pipeline) beside the tier made
# on the GPU from raw uint16 batches (the device pipeline), on the same plate in the same run?
#
#   0. setup: carried wheels, versions, GPU, CPU, shared memory; a full-preset plate (16 fields of
#      5 x 1080 x 1080, ~5,400 cells, the default sharded layout) is generated in the background while
#      step 1 runs;
#   1. demand: Track 3 `gpu-demand` on a smoke plate: ResNet-18, batch 256 of 96 x 96 x 5 crops already on
#      the GPU, train and embed, bf16 and fp32, CUDA-synchronised (compute only: the rate a loader must feed);
#   2. supply: Track 2 `gpu` on the default plate: samples/s at batch 256 on the direct path, both pipelines
#      (dataset: float32 from the workers, pinned by the DataLoader; device: uint16 from the workers, reused
#      pinned buffers, the tier on the GPU), no transforms and typical ones, at 0 1 2 4 8 12 16 workers
#      (capped by the cores), start-up at the most workers (and persistent);
#   3. end to end: Track 3 `gpu` on the default plate: bisected searches for the fewest workers with data
#      wait < 10% (bf16 train and bf16 embed on both pipelines, fp32 train on the device pipeline), each loop
#      followed by the loader alone (supply over demand), step p50/p95, NVML utilisation; then the split of
#      the most workers' cores into workers x decode threads (bf16 train, device pipeline);
#   4. the GPU tests, if time is left; then the loader overhead (Track 2 `overhead`), if time is left;
#      then summary.txt (scripts/gpu_table.py) from the rows: demand, supply, supply over demand.
# The most important rows come first, every command has its own timeout (capped by what is left of
# GPU_CHECK_BUDGET_S, default 440 s, so the whole run fits 8 minutes), and every row is written as soon as
# it is measured, so a cut-short run still returns what it measured. Elapsed seconds are printed per step.
#
# Files in the output folder (OUT_DIR, below): results.jsonl (every row, the record of every track), results.csv, summary.txt,
# gpu_check.log. No figures are drawn there: draw them from the rows with `python -m cropbench plot`.
#
# Assumptions, stated because the machine cannot be inspected beforehand:
# - It runs inside a copy of this repository (any working directory); nothing outside can be reached.
# - `python3` there has torch with CUDA, torchvision, numpy, psutil, pyarrow, tqdm, tifffile, pytest and
#   nvidia-ml-py (torch there may be older than the one pinned in pyproject.toml: the code needs >= 2.3 for
#   uint16 tensors). zarr, numcodecs, donfig and google-crc32c are missing there: they travel as cp312
#   wheels in .whl/ (git-ignored), made beforehand on a machine with PyPI by
#       bash scripts/gpu_check.sh --fetch-wheels
#   and are installed with --no-index into /tmp/cropbench-site. Set PYTHON to use another interpreter.
# - cropbench runs from src/ through PYTHONPATH, not pip install (that would try to fetch the pinned torch).
# - Rows go to the folder named by the first argument (`bash scripts/gpu_check.sh measurements/gpu/my-run`), else
#   OUT_DIR if set, else measurements/gpu/check. PLATE_DIR (default /tmp/cropbench-gpu) holds the plates.
# - With no CUDA device it stops with exit code 2, unless GPU_CHECK_ALLOW_CPU=1: then it is a dry run of the
#   same steps with smoke plates, few samples, and Track 3's smoke preset instead of the CUDA presets.
# Duration: at most the budget plus the summary (~460 s): run it under an outer timeout of 480 s or more.
# The previous grid (zarr and planes rows besides) ran 376 s on one H200 with 16 cores (2026-11-30,
# docs/results/gpu.md); this one has not run on a GPU yet.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
WHEELS="$REPO/.whl"
# Versions the project was tested with (see .venv); zarr 3.1.x needs the other three.
WHEEL_PINS=("zarr==3.1.6" "numcodecs==0.16.6" "donfig==0.8.1.post1" "google-crc32c==1.9.0")

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p "$WHEELS"
  PIP_PYTHON=${PIP_PYTHON:-$REPO/.venv/bin/python}
  [ -x "$PIP_PYTHON" ] || PIP_PYTHON=python3
  "$PIP_PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHEELS" "${WHEEL_PINS[@]}"
  ls -l "$WHEELS"
  exit 0
fi

OUT_DIR=${1:-${OUT_DIR:-measurements/gpu/check}}
PLATE_DIR=${PLATE_DIR:-/tmp/cropbench-gpu}
BUDGET_S=${GPU_CHECK_BUDGET_S:-440}
mkdir -p "$OUT_DIR" "$PLATE_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG="$OUT_DIR/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
step() { echo; echo "== [$(elapsed) s] $*"; }
# timed LIMIT CMD...: runs CMD under `timeout`, the limit capped by what is left of the budget (minus a
# 15 s reserve for the summary); prints how long it took and its exit code; never stops the script.
timed() {
  local limit=$1; shift
  local left=$(( BUDGET_S - $(elapsed) - 15 ))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 10 ]; then echo "   skipped: $(elapsed) s of the $BUDGET_S s budget used"; return 0; fi
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "   -> exit $rc after $(( $(date +%s) - t0 )) s (limit $limit s)$([ "$rc" = 124 ] && echo ': TIMED OUT')"
  return 0
}
step "gpu_check $(date -u +%FT%TZ) in $REPO, out $OUT_DIR, budget $BUDGET_S s"
git -C "$REPO" rev-parse HEAD 2>/dev/null || true

if ! "$PYTHON" -c "import zarr, numcodecs" 2>/dev/null; then
  compgen -G "$WHEELS/*.whl" >/dev/null || {
    echo "zarr is missing and there are no wheels in $WHEELS: run 'bash scripts/gpu_check.sh --fetch-wheels' first" >&2
    exit 1
  }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/cropbench-site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="/tmp/cropbench-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" - <<'EOF' || exit 1
import platform, torch, torchvision, zarr, cropbench
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"torchvision {torchvision.__version__}, zarr {zarr.__version__}, cropbench from {cropbench.__file__}")
print("cuda available:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu,clocks.sm --format=csv 2>/dev/null || true
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null)"
free -g 2>/dev/null | head -2 || true
# Every worker hands its batches over through /dev/shm (48 MiB per float32 batch of 256, two in flight per worker).
df -h /dev/shm 2>/dev/null | tail -1 || true
shm_kib=$(df -k --output=size /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
if [ -n "$shm_kib" ] && [ "$shm_kib" -lt $(( 8 * 1024 * 1024 )) ]; then
  echo "/dev/shm is under 8 GiB: trying to enlarge it to 16 GiB"
  mount -o remount,size=16G /dev/shm 2>&1 || true
  df -h /dev/shm | tail -1 || true
fi

PLATE_PRESET=full
T2_ARGS=(--preset gpu)
T3_ARGS=(--preset gpu)
OVERHEAD_ARGS=()
DEMAND=1
if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  if [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
    echo "no CUDA device: this is the GPU check (set GPU_CHECK_ALLOW_CPU=1 for a CPU dry run)" >&2
    exit 2
  fi
  step "dry run on the CPU: smoke plates, 256 steady samples per Track 2 case, Track 3 smoke preset, no demand step"
  PLATE_PRESET=smoke
  T2_ARGS=(--preset gpu --samples 256)
  T3_ARGS=(--preset smoke --samples 64)
  OVERHEAD_ARGS=(--samples 128)
  DEMAND=0
fi
CLI=("$PYTHON" -m cropbench)
RUN=("${CLI[@]}" run --out "$OUT_DIR" --no-progress)
DEFAULT_PLATE="$PLATE_DIR/$PLATE_PRESET-default.zarr"

step "0. generating $DEFAULT_PLATE in the background"
pids=()
for layout in default; do
  plate="$PLATE_DIR/$PLATE_PRESET-$layout.zarr"
  if [ -d "$plate" ]; then echo "   $plate exists"; continue; fi
  ( t0=$(date +%s); timeout 200 "${CLI[@]}" generate --preset "$PLATE_PRESET" --layout "$layout" --out "$plate" \
      --no-progress; echo "   generate $layout: exit $? after $(( $(date +%s) - t0 )) s" ) >"$PLATE_DIR/generate-$layout.log" 2>&1 &
  pids+=($!)
done

if [ "$DEMAND" = 1 ]; then
  step "1. demand: Track 3 gpu-demand (compute only) on a smoke plate, beside the plate generation"
  SMOKE_PLATE="$PLATE_DIR/smoke-default.zarr"
  [ -d "$SMOKE_PLATE" ] || timed 60 "${CLI[@]}" generate --preset smoke --out "$SMOKE_PLATE" --no-progress
  timed 90 "${RUN[@]}" --plate "$SMOKE_PLATE" --track 3 --preset gpu-demand
fi

step "waiting for the plate"
for pid in "${pids[@]}"; do wait "$pid"; done
cat "$PLATE_DIR"/generate-*.log 2>/dev/null
rm -f "$PLATE_DIR"/generate-*.log

step "2. supply: Track 2 ${T2_ARGS[*]} on $DEFAULT_PLATE"
[ -d "$DEFAULT_PLATE" ] && timed 130 "${RUN[@]}" --plate "$DEFAULT_PLATE" --track 2 "${T2_ARGS[@]}"

step "3. end to end: Track 3 ${T3_ARGS[*]} on $DEFAULT_PLATE"
[ -d "$DEFAULT_PLATE" ] && timed 170 "${RUN[@]}" --plate "$DEFAULT_PLATE" --track 3 "${T3_ARGS[@]}"

step "4. GPU tests (skip without CUDA), if time is left"
timed 40 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/test_device_pipeline.py tests/test_accelerator.py \
  tests/test_track3.py -rs

step "5. loader overhead: Track 2 overhead ${OVERHEAD_ARGS[*]} on $DEFAULT_PLATE, if time is left"
[ -d "$DEFAULT_PLATE" ] && timed 30 "${RUN[@]}" --plate "$DEFAULT_PLATE" --track 2 --preset overhead "${OVERHEAD_ARGS[@]}"

step "summary"
if [ -f "$OUT_DIR/results.jsonl" ]; then
  timeout 30 "$PYTHON" scripts/gpu_table.py "$OUT_DIR/results.jsonl" >"$OUT_DIR/summary.txt"
  cat "$OUT_DIR/summary.txt"
  echo "rows: $(wc -l <"$OUT_DIR/results.jsonl")"
else
  echo "no rows were written" >&2
fi
step "done"
