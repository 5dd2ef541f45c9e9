#!/usr/bin/env bash
# The shipped tiny mesh family, end to end (CPU, 1 thread per job): backbone, then CA and MLP XSpecMesh heads
# in parallel, each written into specgen/assets/mesh (ship_dir in the recipes) and registered.
#   recipes/tiny/run-mesh.sh          # ~65 min backbone + ~60 min heads + ~10 min benchmark and gallery (2 cores)
# Every step resumes from its run folder: rerun the script after an interruption. Logs: docs/logs/tiny/.
set -euo pipefail
LOGS=docs/logs/tiny
export OMP_NUM_THREADS=1
python -m specgen.train.mesh --config recipes/tiny/mesh-gpt.yaml --out runs/mesh-gpt --register mesh-gpt-tiny \
  --log "$LOGS/mesh-gpt.log"
# heads find mesh-gpt-tiny through the registry, which reinstalls it from the asset just written
specgen train-heads --kind xspecmesh --config recipes/tiny/xspecmesh-heads.yaml --out runs/xspecmesh-ca \
  > "$LOGS/xspecmesh-ca-heads.log" 2>&1 &
ca=$!
specgen train-heads --kind xspecmesh --config recipes/tiny/xspecmesh-heads.yaml --out runs/xspecmesh-mlp \
  head_kind=mlp name=xspecmesh-mlp-tiny > "$LOGS/xspecmesh-mlp-heads.log" 2>&1 &
mlp=$!
wait "$ca" && wait "$mlp"   # a failed heads run stops the script (set -e)
specgen benchmark --config recipes/tiny/bench-meshes.yaml --out runs/bench_meshes.jsonl  # the paper's table 3
# the gallery of docs/methods/xspecmesh.md
specgen generate --method ar --model mesh-gpt-tiny --num 6 --out-dir runs/gallery/ar preview=true > /dev/null
specgen generate --method xspecmesh --num 6 --out-dir runs/gallery/xspecmesh preview=true > /dev/null
python scripts/mesh_gallery.py runs/gallery/ar runs/gallery/xspecmesh --out docs/mesh_gallery.png
