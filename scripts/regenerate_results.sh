#!/usr/bin/env bash
# Regenerate every committed sweep from the code on main (2 CPU cores: about two hours in all).
# Usage: bash scripts/regenerate_results.sh [RPWJAX]   (RPWJAX: the rpwjax command, default .venv/bin/rpwjax)
set -euo pipefail
cd "$(dirname "$0")/.."
RPW=${1:-.venv/bin/rpwjax}
LOW="0.05 0.1 0.3 0.5 0.8 1 1.5 2"
run() { local name=$1; shift; local start=$SECONDS; "$RPW" "$@" --quiet > "results/logs/$name.txt"; echo "$name: $((SECONDS - start)) s" | tee -a results/logs/times.txt; }
mkdir -p results/logs
: > results/logs/times.txt
for d in crime california; do
  run "$d" curves --dataset "$d" --seeds 3 --out "results/$d"
  mv "results/$d/${d}_curves.png" "plots/${d}_curves.png"
done
for d in crime california; do
  run "posterior-$d" curves --dataset "$d" --mechanisms rpwithprior rr-on-bins unbiased \
      --denoise rpwithprior rr-on-bins unbiased --epsilon $LOW --seeds 3 --out "results/posterior-denoising/$d"
  mv "results/posterior-denoising/$d/results.csv" "results/posterior-denoising/$d.csv"
  rm -r "results/posterior-denoising/$d"
done
for d in crime california; do
  run "beyond-$d" curves --dataset "$d" --mechanisms rpwithprior \
      --variants rpwithprior+calibrated two-stage two-stage-rpwithprior two-stage-unbiased linear-prior \
      --epsilon $LOW --seeds 3 --out "results/beyond/$d"
done
run "beyond-california-5-seeds" curves --dataset california --mechanisms unbiased --variants two-stage-unbiased \
    --epsilon 1 1.5 2 --seeds 5 --out results/beyond/california-5-seeds
rm -f results/beyond/*/*_curves.png
"$(dirname "$RPW")/python" scripts/beyond_report.py
