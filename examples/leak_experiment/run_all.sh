#!/usr/bin/env bash
# The whole leak experiment on one GPU machine: every configuration x every seed, then the report.
# Resumable: a run that finished is skipped, one that stopped (time limit, --max-steps-this-call)
# continues from its checkpoint, so the experiment can be split over several GPU jobs by running
# this script again with the same RUNS folder (copy it back and forth, or keep it on the machine).
#
#   DATA=.carry/corpus RUNS=runs SEEDS="0 1" STEPS=1200 BUDGET_S=540 bash examples/leak_experiment/run_all.sh
#
# BUDGET_S: stop starting new work after this many seconds (a run in flight finishes its current
# --max-steps-this-call chunk of CHUNK steps). CONFIGS: which configurations (default: all of
# configs.py, in its order). Extra arguments go to every train.py call.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
DATA=${DATA:-.carry/corpus}
RUNS=${RUNS:-runs}
SEEDS=${SEEDS:-"0 1"}
STEPS=${STEPS:-1200}
CHUNK=${CHUNK:-400}
BUDGET_S=${BUDGET_S:-0}
PYTHON=${PYTHON:-python3}
CONFIGS=${CONFIGS:-$(cd examples/leak_experiment && "$PYTHON" -c 'import configs; print(*configs.CONFIGS)')}
start=$SECONDS
for seed in $SEEDS; do
  for config in $CONFIGS; do
    out="$RUNS/${config}_s${seed}"
    while true; do
      if [ -f "$out/run.json" ] && grep -q '"done": true' "$out/run.json"; then
        echo "run_all: $config seed $seed done"
        break
      fi
      if [ "$BUDGET_S" -gt 0 ] && [ $((SECONDS - start)) -ge "$BUDGET_S" ]; then
        echo "run_all: time budget reached; run this script again to continue"
        "$PYTHON" examples/leak_experiment/report.py --runs "$RUNS" || true
        exit 3
      fi
      echo "run_all: $config seed $seed (chunk of $CHUNK steps, $((SECONDS - start)) s elapsed)"
      "$PYTHON" examples/leak_experiment/train.py --data "$DATA" --config "$config" --seed "$seed" --out "$out" \
        --steps "$STEPS" --max-steps-this-call "$CHUNK" "$@" || exit 1
    done
  done
done
"$PYTHON" examples/leak_experiment/report.py --runs "$RUNS" --markdown "$RUNS/report.md" --plot "$RUNS/loss_curves.png"
