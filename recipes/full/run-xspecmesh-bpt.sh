#!/usr/bin/env bash
# XSpecMesh on a BPT-size backbone end to end: backbone, CA and MLP heads (+ LoRA), dry run, benchmark, report.
# Every step resumes from its run folder. The trainers are CPU-only today (no device key; see the recipe headers).
set -euo pipefail
R=recipes/full
python -m specgen.train.mesh --config "$R/mesh-gpt-bpt.yaml" --out runs/mesh-gpt-bpt --register mesh-gpt-bpt
specgen train-heads --kind xspecmesh --config "$R/xspecmesh-heads-bpt.yaml" --out runs/xspecmesh-ca-bpt
specgen train-heads --kind xspecmesh --config "$R/xspecmesh-heads-bpt.yaml" --out runs/xspecmesh-mlp-bpt \
  head_kind=mlp name=xspecmesh-mlp-bpt
specgen benchmark --config "$R/bench-meshes-bpt.yaml" --dry-run
specgen benchmark --config "$R/bench-meshes-bpt.yaml" --run-dir runs/bench-meshes-bpt
specgen benchmark report runs/bench-meshes-bpt
