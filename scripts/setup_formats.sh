#!/usr/bin/env bash
# Install the libraries of the training formats `cropbench compare-formats` measures (h5py, webdataset,
# litdata, MosaicML streaming) into .venv, at the versions cropbench was tested with (each format's
# `versions`). mosaicml-streaming pins numpy<2.2 and xxhash<4, so it is installed without its
# dependencies and then the modules it imports (MdsFormat's docstring), keeping .venv's numpy.
# Run scripts/setup.sh first; a no-op when everything is installed.
#   bash scripts/setup_formats.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "setup_formats: .venv is missing; run scripts/setup.sh first" >&2; exit 1; }
python() { PYTHONPATH=src .venv/bin/python -c "from cropbench.data.training import TRAINING_FORMATS as F; $1"; }
pin='f"{c.library}>={c.versions[0]},<{c.versions[1]}"'
read -r -a plain <<< "$(python "print(' '.join($pin for c in F.values() if c.name != 'mds'))")"
mds=$(python "c = F['mds']; print($pin)")
read -r -a imports <<< "$(python "from cropbench.data.training.mds_shards import MDS_IMPORTS; print(' '.join(MDS_IMPORTS))")"
numpy_before=$(.venv/bin/python -c "import numpy; print(numpy.__version__)")
.venv/bin/pip install -q "${plain[@]}"
.venv/bin/pip install -q --no-deps "$mds"
.venv/bin/pip install -q "${imports[@]}"
numpy_after=$(.venv/bin/python -c "import numpy; print(numpy.__version__)")
if [ "$numpy_before" != "$numpy_after" ]; then
  echo "setup_formats: numpy changed from $numpy_before to $numpy_after; reinstall it with scripts/setup.sh" >&2
  exit 1
fi
python "
missing = [reason for reason in (c.available() for c in F.values()) if reason]
print('\n'.join(missing) or 'every training format is installed')
raise SystemExit(1 if missing else 0)"
