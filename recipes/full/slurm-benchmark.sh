#!/usr/bin/env bash
# A benchmark recipe as a Slurm array job: shard I of N (0-based) per array task, one GPU each, then a dependent
# job that merges the shards into the report. Submit this script itself (it submits the two jobs):
#
#   RECIPE=recipes/full/bench-llamagen-c2i-l.yaml RUN_DIR=runs/bench-llamagen-c2i-l SHARDS=8 \
#       recipes/full/slurm-benchmark.sh
#
# Every task runs the same command with its own --shard I/N; rerunning a task (or the whole array) resumes from
# what RUN_DIR already holds, and a changed recipe on an existing RUN_DIR is refused (use a new RUN_DIR).
# Check the recipe first, without a GPU:  specgen benchmark --config "$RECIPE" --dry-run
#
# On one node with several GPUs, torchrun gives one shard per process instead of an array:
#   torchrun --nproc-per-node 4 -m cli.main benchmark --config "$RECIPE" --run-dir "$RUN_DIR"
#   specgen benchmark report "$RUN_DIR"
#
# Site settings (partition, account, time, modules, venv) are placeholders: edit the #SBATCH lines of the
# generated job below or pass sbatch options in SBATCH_ARGS (e.g. SBATCH_ARGS="--partition=gpu --account=me").
set -euo pipefail

RECIPE=${RECIPE:?set RECIPE=recipes/full/<recipe>.yaml}
RUN_DIR=${RUN_DIR:?set RUN_DIR=runs/<name>}
SHARDS=${SHARDS:-8}
TIME=${TIME:-04:00:00}
VENV=${VENV:-.venv}
SBATCH_ARGS=${SBATCH_ARGS:-}
LOGS="${RUN_DIR%/}.slurm"  # beside the run folder: a run starts only in a new or empty folder (or its own)
mkdir -p "$LOGS"

# The array: task I runs shard I of SHARDS (SLURM_ARRAY_TASK_ID is 0-based with --array=0-(N-1)). The count is
# SHARDS, not SLURM_ARRAY_TASK_COUNT, which is 1 when a failed task is resubmitted alone (--array=I).
# shellcheck disable=SC2086
ARRAY_JOB=$(sbatch --parsable $SBATCH_ARGS \
  --job-name=specgen-bench --array="0-$((SHARDS - 1))" --gres=gpu:1 --cpus-per-task=8 --mem=64G --time="$TIME" \
  --output="$LOGS/shard-%a.out" \
  --export=ALL,RECIPE="$RECIPE",RUN_DIR="$RUN_DIR",VENV="$VENV",SHARDS="$SHARDS" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
. "$VENV/bin/activate"
specgen benchmark --config "$RECIPE" --run-dir "$RUN_DIR" --shard "${SLURM_ARRAY_TASK_ID}/${SHARDS}"
EOF
)
echo "submitted array job $ARRAY_JOB ($SHARDS shards of $RECIPE)"

# The report: runs once every shard has succeeded (afterok); a failed shard leaves it pending -- resubmit that
# shard (sbatch --array=I ...) or rerun the whole array, then `scontrol release` / resubmit the report.
# shellcheck disable=SC2086
REPORT_JOB=$(sbatch --parsable $SBATCH_ARGS \
  --job-name=specgen-report --dependency="afterok:$ARRAY_JOB" --cpus-per-task=2 --mem=8G --time=00:30:00 \
  --output="$LOGS/report.out" \
  --export=ALL,RUN_DIR="$RUN_DIR",VENV="$VENV" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
. "$VENV/bin/activate"
specgen benchmark report "$RUN_DIR"
EOF
)
echo "submitted report job $REPORT_JOB (after $ARRAY_JOB): $LOGS/report.out"
