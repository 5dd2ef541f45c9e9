#!/usr/bin/env bash
# XSpecMesh on a BPT-size backbone end to end: backbone, CA and MLP heads (+ LoRA), dry run, benchmark, report.
# Every step resumes from its run folder. The trainers run on $DEVICE (default cuda; DEVICE=cpu for the CPU).
set -euo pipefail
DEVICE=${DEVICE:-cuda}  # the trainers' device (the benchmarks' is their recipe's `device`)
R=recipes/full
python -m specgen.train.mesh --config "$R/mesh-gpt-bpt.yaml" --out runs/mesh-gpt-bpt --register mesh-gpt-bpt \
  --device "$DEVICE"
specgen train-heads --kind xspecmesh --config "$R/xspecmesh-heads-bpt.yaml" --out runs/xspecmesh-ca-bpt \
  --device "$DEVICE"
specgen train-heads --kind xspecmesh --config "$R/xspecmesh-heads-bpt.yaml" --out runs/xspecmesh-mlp-bpt \
  --device "$DEVICE" head_kind=mlp name=xspecmesh-mlp-bpt
specgen benchmark --config "$R/bench-meshes-bpt.yaml" --dry-run
specgen benchmark --config "$R/bench-meshes-bpt.yaml" --run-dir runs/bench-meshes-bpt
specgen benchmark report runs/bench-meshes-bpt
