#!/usr/bin/env bash
# Create .venv (Python 3.11) with cropbench, its dev tools, the object-store extra and the docs tools (mkdocs);
# a no-op when up to date.
# The first run downloads and unpacks about 6.5 GB (most of it torch's CUDA build): about 10 minutes on a
# 2-core machine. It prints one line per package pip collects or downloads (with its size) and per install
# step, and "setup: pip still working (N s)" every 30 s while pip runs (resolving prints nothing for a while);
# pip's whole output goes to .venv/setup-pip.log.
set -euo pipefail

# talk: pip's output in, a short line per step out (what pip collects, downloads with its size, builds,
# installs), errors in full; the rest only in the log. fflush: each line shows as pip gets there.
talk() {
  awk '
    /^WARNING: Location/ { next }
    /ERROR|[Ee]rror:/ { print; fflush(); next }
    { sub(/ \(from [^)]*\)$/, "") }
    /^Collecting / { print "  pip: " tolower(substr($0, 1, 1)) substr($0, 2); fflush(); next }
    /^ *(Downloading|Using cached|Processing) / && !/\.metadata/ {
      sub(/^ +/, "")
      if ($1 == "Processing") { n = split($2, path, "/"); $2 = path[n] }
      print "  pip:   " tolower(substr($0, 1, 1)) substr($0, 2); fflush(); next
    }
    /^ *Building (editable|wheel)s? for / { sub(/^ +/, ""); print "  pip: " tolower(substr($0, 1, 1)) substr($0, 2); fflush(); next }
    /^Installing collected packages: / {
      n = split(substr($0, 32), names, ", ")
      slow = ""
      for (i = 1; i <= n; i++) if (names[i] == "torch") slow = " (unpacking torch and its CUDA libraries takes minutes)"
      print "  pip: installing " n " package" (n == 1 ? "" : "s") slow; fflush(); next
    }
    /^Successfully installed / { print "  pip: installed " NF - 2 " package" (NF == 3 ? "" : "s"); fflush(); next }
  '
}

# heartbeat SECONDS COMMAND...: run COMMAND, and while it runs print a line every SECONDS, so a resolver
# that is thinking (or backtracking) without output does not look like a hang; COMMAND's exit code.
heartbeat() {
  local interval=$1 started=$SECONDS beat rc=0
  shift
  (
    while sleep "$interval" >/dev/null 2>&1; do
      echo "setup: pip still working ($((SECONDS - started)) s)"
    done
  ) &
  beat=$!
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}

# pip_logged ARGS...: pip install ARGS, its steps on the terminal, its whole output in the log.
pip_logged() {
  .venv/bin/python -m pip install --progress-bar off "$@" 2>&1 | tee -a "$log" | talk
}

# pip_install WHAT ARGS...: pip_logged with a heartbeat every 30 s; one line if it fails.
pip_install() {
  local what=$1
  shift
  if ! heartbeat 30 pip_logged "$@"; then
    echo "setup: pip could not install $what; its whole output is in $log" >&2
    exit 1
  fi
}

# apt_optional PACKAGE TOOL WHAT: install a system package with apt-get (through sudo -n unless root) when
# TOOL is neither on the PATH nor in /usr/sbin (a TOOL starting with / is a file the package installs, such
# as an nginx module); never fatal: where it cannot be installed, one line says so and what will skip (WHAT).
apt_optional() {
  local package=$1 tool=$2 what=$3 sudo=""
  case $tool in
    /*) if [ -e "$tool" ]; then return 0; fi ;;
    *) if command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ]; then return 0; fi ;;
  esac
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: $tool is not installed and there is no apt-get (install $package); $what" >&2
    return 0
  fi
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  if ! { $sudo apt-get update -q && $sudo apt-get install -y -q "$package"; } >/dev/null 2>&1; then
    echo "setup: could not install $package (apt-get install -y $package); $what" >&2
  fi
  return 0
}

# Sourced (tests/test_setup.py, .ci/run): the functions above only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
# valgrind counts instructions for benchmarks/instructions.py (a system package, not a Python one).
apt_optional valgrind valgrind "the instruction-count benchmarks and tests will skip"
# nginx's Lua module (it brings nginx): the emulated object store's per-request latency.
apt_optional libnginx-mod-http-lua /usr/share/nginx/modules/ngx_http_lua_module.so "the store emulation tests will skip"
stamp=.venv/.cropbench-setup
log=.venv/setup-pip.log
# [remote]: the object-store clients and the loopback S3 server the remote tests start (tests/test_remote.py);
# [docs]: mkdocs, its theme and mkdocstrings (the API reference), for scripts/docs_build.sh and the site scripts/asv_publish.sh publishes.
extras=dev,remote,docs
want=$({ cat pyproject.toml setup.py src/cropbench/formats/_native.c; echo "$extras"; } | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
started=$SECONDS
if [ -x .venv/bin/python ]; then
  echo "setup: updating .venv (pyproject.toml, setup.py, the C extension or the extras changed, or the last setup" \
    "did not finish)"
else
  echo "setup: building .venv from pyproject.toml: torch, torchvision, zarr, the dev and docs tools, about 6.5 GB" \
    "(most of it torch's CUDA build); about 10 minutes on a 2-core machine. Later runs skip this."
  "$PYTHON" -m venv .venv
fi
: >"$log"

echo "setup: upgrading pip"
pip_install pip --upgrade pip
echo "setup: installing cropbench with its dependencies (the longest step)"
# torch/torchvision are pinned in pyproject.toml (2.14.1 / 0.29.1); pip takes them from its configured index.
pip_install cropbench -e ".[$extras]"
.venv/bin/python -c "import cropbench, torch, zarr" || { echo "setup failed: cropbench did not import" >&2; exit 1; }
echo "$want" >"$stamp"
echo "setup: .venv ready in $((SECONDS - started)) s, $(du -sh .venv 2>/dev/null | cut -f1) on disk"
