#!/usr/bin/env bash
# vcuda's real-hardware validation in one command (issue 7).
#
#   gpu_tests/run_all.sh [extra pytest arguments, e.g. -k memory]
#
# Needs only the NVIDIA driver, Python 3.11+, CuPy and/or PyTorch, pytest and
# cffi; nothing is fetched at run time. Writes into ${OUT:-gpu_results}/:
#   env.json      the machine: date, GPU, driver, CUDA driver version, CuPy/PyTorch
#                 and their CUDA runtime versions, vcuda commit
#   tests.json    per-test outcome and figures (VCUDA_GPU_RESULTS of the suite)
#   results.json  both of the above plus the pytest exit status
#   summary.md    the same for humans (paste its figures into gpu_tests/RESULTS.md)
#   pytest.log, junit.xml
# Exit status: pytest's when tests fail; 3 when no GPU was found (nothing
# measured); 2 on a setup problem; 0 when everything ran and passed.
#
# Knobs: PYTHON (interpreter, default python3), VCUDA_LIB_DIR (prebuilt libvcuda),
# VCUDA_CUDA12_PYTHON (interpreter with cupy-cuda12x / a cu12 torch),
# VCUDA_GPU_TEST_GPU, VCUDA_GPU_TEST_QUOTA, VCUDA_GPU_TEST_SHARED_QUOTA,
# VCUDA_GPU_TEST_SECONDS, VCUDA_GPU_TEST_WARMUP (see gpu_tests/conftest.py).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
cd "$REPO" || exit 2
PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-gpu_results}"
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

log() { echo "run_all: $*" >&2; }

# libvcuda.so of an installed vcuda (imported from /, so the checkout's
# py_vcuda does not shadow it); prints its directory.
installed_lib_dir() {
  (cd / && env -u PYTHONPATH "$PY" -c \
    'from py_vcuda import native; print(native.lib_path(native.SHIM).parent)') 2>/dev/null
}

has_module() { "$PY" -c "import $1" >/dev/null 2>&1; }

# Wheels carried with the checkout (no index is reachable from a GPU machine):
# pyzmq, cffi, pytest, scikit-build-core, ... as needed. Installed once, offline.
install_carried_wheels() {
  if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
    log "installing carried wheels from .whl/ (offline)"
    "$PY" -m pip install --no-index --no-deps .whl/*.whl || log "some carried wheels did not install"
  fi
}

# 1. Prerequisites of the suite itself.
if ! has_module pytest || ! has_module cffi; then
  install_carried_wheels
fi
for m in pytest cffi; do
  if ! has_module "$m"; then
    log "python module '$m' is missing in $PY and no carried wheel provides it (put its .whl in .whl/)"
    exit 2
  fi
done

# 2. libvcuda: a given build, an in-place build, an installed vcuda, or build it now.
if [ -n "${VCUDA_LIB_DIR:-}" ] && [ -f "$VCUDA_LIB_DIR/libvcuda.so" ]; then
  log "libvcuda from VCUDA_LIB_DIR=$VCUDA_LIB_DIR"
elif [ -f "$REPO/py_vcuda/lib/libvcuda.so" ]; then
  export VCUDA_LIB_DIR="$REPO/py_vcuda/lib"
  log "libvcuda built in place: $VCUDA_LIB_DIR"
elif dir="$(installed_lib_dir)" && [ -n "$dir" ]; then
  export VCUDA_LIB_DIR="$dir"
  log "libvcuda of the installed vcuda: $VCUDA_LIB_DIR"
else
  # vcuda is not installed: install it from this checkout, offline. pyzmq/cffi
  # (and scikit-build-core for the build) may have to come from a carried .whl/
  # directory: `pip download -d .whl ...` on a machine with an index.
  if ! command -v vcuda >/dev/null 2>&1; then
    install_carried_wheels
    log "installing vcuda from the checkout"
    "$PY" -m pip install --no-build-isolation --no-deps . || log "pip install failed"
  fi
  if dir="$(installed_lib_dir)" && [ -n "$dir" ]; then
    export VCUDA_LIB_DIR="$dir"
  elif command -v cmake >/dev/null 2>&1; then
    log "building libvcuda with CMake into build/gpu-tests"
    cmake -S . -B build/gpu-tests -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build/gpu-tests -j \
      || { log "CMake build failed"; exit 2; }
    export VCUDA_LIB_DIR="$REPO/build/gpu-tests/lib"
  else
    log "no libvcuda.so: install vcuda (pip install .), or set VCUDA_LIB_DIR to a build"
    exit 2
  fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# 3. The machine.
"$PY" gpu_tests/report.py env >"$OUT_DIR/env.json" || log "could not record the environment"
"$PY" - "$OUT_DIR/env.json" <<'EOF' >&2 || true
import json, sys
e = json.load(open(sys.argv[1]))
gpus = ", ".join(g["name"] for g in e.get("gpus", [])) or "none"
print(f"run_all: {e.get('date')} GPU {gpus}; driver {e.get('driver_version')} "
      f"(CUDA {e.get('cuda_driver_version')}); frameworks {json.dumps(e.get('frameworks'))}")
EOF

# 4. The suite.
rm -f "$OUT_DIR/tests.json"
VCUDA_GPU_RESULTS="$OUT_DIR/tests.json" "$PY" -m pytest gpu_tests -v -p no:cacheprovider \
  --junitxml="$OUT_DIR/junit.xml" "$@" 2>&1 | tee "$OUT_DIR/pytest.log"
rc=${PIPESTATUS[0]}

# 5. results.json + summary.md; the exit status says whether it passed.
"$PY" gpu_tests/report.py summarize --env "$OUT_DIR/env.json" --tests "$OUT_DIR/tests.json" \
  --pytest-exit "$rc" --out "$OUT_DIR"
status=$?
log "results in $OUT_DIR/results.json and $OUT_DIR/summary.md (exit $status)"
exit "$status"
