#!/usr/bin/env bash
# The device check of issue 7 in one script: does the loader keep a GPU fed?
#
#   1. the GPU tests (pytest -m gpu) plus the CPU tests of the Track 3 modules, on the device's torch;
#   2. a synthetic plate (preset full: 16 fields of 5 x 1080 x 1080, ~5,100 cells) in the default layout;
#   3. Track 3's `gpu` preset: ResNet-18, 96 x 96 x 5 crops, batch 256, bf16, CUDA, swept over num_workers
#      (0 1 2 4 6 8 12 16, capped by the cores) for the zarr-python path and the fast `direct` path, each
#      with its "minimum workers for >= 90% accelerator utilisation" answer; then fp16 + GradScaler, embedding
#      extraction, channels_last and uint16-over-the-bus at 8 workers;
#   4. summary table, CSV and figures.
# Rows go to OUT_DIR/results.jsonl (the same record as every track), the rest beside it.
#
# Assumptions, stated because the machine cannot be inspected beforehand:
# - It runs inside a copy of this repository (any working directory); nothing outside can be reached.
# - `python3` there has torch with CUDA, torchvision, numpy, psutil, matplotlib, pyarrow, tqdm, tifffile,
#   pytest and nvidia-ml-py (the device notes list them; torch there may be older than the 2.14.1 pinned in
#   pyproject.toml: the code needs >= 2.3 for uint16 tensors). zarr, numcodecs, donfig and google-crc32c are
#   missing there: they travel as cp312 wheels in .whl/ (git-ignored), made beforehand on a machine with PyPI by
#       bash scripts/gpu_check.sh --fetch-wheels
#   and are installed with --no-index into /tmp/cropbench-site. Set PYTHON to use another interpreter.
# - cropbench runs from src/ through PYTHONPATH, not pip install (that would try to fetch the pinned torch).
# - OUT_DIR defaults to $OUT (set by the device tool; what is written there comes back, at most 8 files,
#   two folders deep), else out/gpu-check. PLATE_DIR (default /tmp/cropbench-gpu) holds the plates.
#   LAYOUTS="default sharded" adds layouts (one sweep each; default: "default").
# - With no CUDA device it stops with exit code 2, unless GPU_CHECK_ALLOW_CPU=1: then it is a dry run of the
#   same steps with the smoke plate and Track 3's smoke preset (used to test this script on a CPU machine).
# Duration: not yet run on a GPU; estimated ~5 minutes on one H200 with 16 cores (plate, tests, sweep),
# so give the call a timeout of about 7 minutes (420 s), which leaves device time for one rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
WHEELS="$REPO/.whl"
# Versions the project was tested with here (see .venv); zarr 3.1.x needs the other three.
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

OUT_DIR=${OUT_DIR:-${OUT:-out/gpu-check}}
PLATE_DIR=${PLATE_DIR:-/tmp/cropbench-gpu}
LAYOUTS=${LAYOUTS:-default}
mkdir -p "$OUT_DIR" "$PLATE_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG="$OUT_DIR/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
echo "== gpu_check $(date -u +%FT%TZ) in $REPO, out $OUT_DIR"

if ! "$PYTHON" -c "import zarr, numcodecs" 2>/dev/null; then
  compgen -G "$WHEELS/*.whl" >/dev/null || {
    echo "zarr is missing and there are no wheels in $WHEELS: run 'bash scripts/gpu_check.sh --fetch-wheels' first" >&2
    exit 1
  }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/cropbench-site "$WHEELS"/*.whl
  export PYTHONPATH="/tmp/cropbench-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" - <<'EOF'
import platform, torch, torchvision, zarr, cropbench
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"torchvision {torchvision.__version__}, zarr {zarr.__version__}, cropbench from {cropbench.__file__}")
print("cuda available:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv 2>/dev/null || true
echo "cores: $(nproc)"

PLATE_PRESET=full
PRESET=gpu
if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  if [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
    echo "no CUDA device: this is the GPU check (set GPU_CHECK_ALLOW_CPU=1 for a CPU dry run)" >&2
    exit 2
  fi
  echo "== dry run on the CPU: smoke plate, Track 3 smoke preset"
  PLATE_PRESET=smoke
  PRESET=smoke
fi

echo "== tests (GPU tests, and the CPU tests of the Track 2/3 modules on this torch)"
set +e
"$PYTHON" -m pytest -q -p no:cacheprovider -m "gpu or not slow" tests/test_accelerator.py tests/test_models.py \
  tests/test_loader.py tests/test_track3.py -rs
tests_status=$?
set -e
echo "tests exit code: $tests_status"

for layout in $LAYOUTS; do
  plate="$PLATE_DIR/$PLATE_PRESET-$layout.zarr"
  if [ ! -d "$plate" ]; then
    echo "== generating $plate"
    time "$PYTHON" -m cropbench generate --preset "$PLATE_PRESET" --layout "$layout" --out "$plate" --no-progress
  fi
  echo "== Track 3 preset $PRESET on $plate"
  time "$PYTHON" -m cropbench run --plate "$plate" --track 3 --preset "$PRESET" --out "$OUT_DIR" --no-progress \
    | tee -a "$OUT_DIR/summary.txt"
done

"$PYTHON" -m cropbench plot "$OUT_DIR/results.jsonl" --out "$OUT_DIR/plots"
echo "== done: rows in $OUT_DIR/results.jsonl; tests exit code $tests_status"
exit "$tests_status"
