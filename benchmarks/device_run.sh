#!/usr/bin/env bash
# Core rpwjax benchmarks on a device machine (GPU when JAX can see one), at most ~8 minutes.
#
#   OUT=/some/dir bash benchmarks/device_run.sh
#
# Writes $OUT/device_results.json (labels per second, backend, devices) and
# $OUT/device_run.log. Installing packages is optional: if a registry is not
# reachable the script runs on whatever JAX backend is present and records it.
# Never needed by the tests or CI.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
LOG="$OUT/device_run.log"
TOTAL=470          # seconds for the whole script, installs included
log() { echo "[device_run] $*" | tee -a "$LOG"; }

if ! "$PY" -c 'import jax, numpy, scipy, pyarrow, tqdm' >/dev/null 2>&1; then
  log "installing missing Python dependencies (optional)"
  timeout 90 "$PY" -m pip install -q jax numpy scipy pyarrow tqdm >>"$LOG" 2>&1 || log "dependency install failed; continuing"
fi
if ! "$PY" -c 'import jax; jax.devices("gpu")' >/dev/null 2>&1; then
  log "JAX sees no GPU; trying pip install 'jax[cuda12]' (optional)"
  timeout 150 "$PY" -m pip install -q 'jax[cuda12]' >>"$LOG" 2>&1 || log "jax[cuda12] install failed; using the backend present"
fi
"$PY" -c 'import jax; print("backend", jax.default_backend(), jax.devices())' 2>&1 | tee -a "$LOG"

LEFT=$(( TOTAL - SECONDS ))
if (( LEFT < 60 )); then LEFT=60; fi
BUDGET=$(( LEFT * 3 / 4 ))   # no new group starts after this; the last one gets the rest
log "running device_bench.py (timeout ${LEFT}s, budget ${BUDGET}s)"
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout "$LEFT" "$PY" benchmarks/device_bench.py \
  --out "$OUT" --budget "$BUDGET" ${DEVICE_BENCH_ARGS:-} 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
log "exit status $status"
rm -rf "$OUT/cache"
exit "$status"
