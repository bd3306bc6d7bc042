#!/usr/bin/env bash
# The release path and the vmapped fits on a device machine (a GPU when JAX sees one), about 6 minutes.
#
#   OUT=/some/dir bash benchmarks/device_run.sh
#
# Writes $OUT/results.json (the schema of `rpwjax bench`: every case's median,
# its ratio to the same run's baseline, labels per second, backend, devices),
# one plot per family and $OUT/device_run.log. Installs nothing: it runs on the
# Python ($PYTHON, default python3) and JAX backend present and records which.
# Never needed by the tests or CI.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
LOG="$OUT/device_run.log"
TOTAL="${TOTAL:-420}"   # seconds for the whole script
log() { echo "[device_run] $*" | tee -a "$LOG"; }

if ! "$PY" -c 'import jax, numpy, scipy, pyarrow, tqdm, optax, matplotlib, cryptography' >>"$LOG" 2>&1; then
  log "a dependency is missing for $PY (needs jax, numpy, scipy, pyarrow, tqdm, optax, matplotlib, cryptography); see $LOG"
  exit 2
fi
"$PY" -c 'import jax; print("backend", jax.default_backend(), jax.devices())' 2>&1 | tee -a "$LOG"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$LOG"

LEFT=$(( TOTAL - SECONDS ))
BUDGET=$(( LEFT * 3 / 5 ))   # no new group starts after this; the last one gets the rest
log "running device_bench.py (timeout ${LEFT}s, budget ${BUDGET}s)"
PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "$LEFT" "$PY" benchmarks/device_bench.py \
  --out "$OUT" --budget "$BUDGET" ${DEVICE_BENCH_ARGS:-} 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
log "exit status $status"
rm -rf "$OUT/cache"
exit "$status"
