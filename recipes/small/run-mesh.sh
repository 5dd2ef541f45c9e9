#!/usr/bin/env bash
# The larger mesh family (NOT shipped), end to end on a CPU: backbone (~70 min on 2 threads), CA heads + LoRA
# (~45 min), the benchmarks (~15 min). Every step resumes from its run folder: rerun after an interruption.
set -euo pipefail
LOGS=docs/logs/small
export OMP_NUM_THREADS=2
python -m specgen.train.mesh --config recipes/small/mesh-gpt.yaml --out runs/mesh-gpt-small \
  --register mesh-gpt-small --log "$LOGS/mesh-gpt-small.log"
specgen train-heads --kind xspecmesh --config recipes/small/xspecmesh-heads.yaml --out runs/xspecmesh-ca-small \
  > "$LOGS/xspecmesh-ca-small-heads.log" 2>&1
specgen benchmark --config recipes/small/bench-meshes.yaml --out runs/bench-meshes-small.jsonl \
  > "$LOGS/bench-meshes-small.log" 2>&1
# the CPU settings of docs/results/mesh.md: argmax + n-gram lookup candidates, D 4 and D 2
specgen benchmark --config recipes/small/bench-meshes.yaml \
  'rows=[ar,ca+lora]' 'options={sampling: tree, top_k_tree: 1, lookup: 1}' 'tree_k=[]' 'lookups=[]' \
  --out runs/bench-meshes-small-lookup.jsonl \
  > "$LOGS/bench-meshes-small-lookup.log" 2>&1
python scripts/mesh_oracle_speed.py --heads xspecmesh-ca-small | tee "$LOGS/mesh-oracle-speed-small.log"
# vertex lookup (argmax candidates, D 4 / 2 / 1, bf16 head logits), its independent-sampling row, n-gram lookup
specgen benchmark --config recipes/small/bench-meshes.yaml \
  'rows=[ar,vertex,vertex-is,ngram]' 'heads={vertex: xspecmesh-ca-small, vertex-is: xspecmesh-ca-small, ngram: xspecmesh-ca-small}' \
  'options.vertex={sampling: tree, top_k_tree: 1, vertex_lookup: true}' 'options.vertex-is={vertex_lookup: true}' \
  'options.ngram={sampling: tree, top_k_tree: 1, lookup: 1}' sweep_row=vertex \
  'tree_k=[]' 'depths=[2,1]' 'draft_dtypes=[bfloat16]' 'lookups=[]' --out runs/bench-meshes-small-vertex.jsonl \
  > "$LOGS/bench-meshes-small-vertex.log" 2>&1
python scripts/mesh_head_accuracy.py runs/xspecmesh-ca-small/labels.safetensors --heads xspecmesh-ca-small \
  | tee "$LOGS/mesh-head-accuracy-small.log"
python scripts/mesh_candidate_replay.py runs/xspecmesh-ca-small/labels.safetensors --heads xspecmesh-ca-small \
  | tee "$LOGS/mesh-candidate-replay-small.log"
