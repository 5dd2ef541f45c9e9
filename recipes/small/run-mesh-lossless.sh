#!/usr/bin/env bash
# Lossless XSpecMesh on the larger backbone (NOT shipped): which heads make it fastest? Needs recipes/small/run-mesh.sh
# first (backbone, CA heads + LoRA, their labels in runs/xspecmesh-ca-small). Four more heads from the same labels
# (16-epoch stage 1 with / without skip_known_offsets, ~45 min each on 1 thread, in parallel; a KL stage 2 on the
# recipe's stage 1, ~40 min on 2 threads, and a 2-epoch one on the skip heads, ~20 min), then the benchmarks
# (~12 min). Every step resumes from its run folder.
set -euo pipefail
LOGS=docs/logs/small
HEADS="specgen train-heads --kind xspecmesh --config recipes/small/xspecmesh-heads.yaml"
for run in e16 skip kl skipkl; do  # reuse the recipe's labels (and, for kl, its finished stage 1)
  mkdir -p runs/xspecmesh-ca-small-$run
  cp -n runs/xspecmesh-ca-small/labels.safetensors runs/xspecmesh-ca-small-$run/
done
cp -n runs/xspecmesh-ca-small/stage1.safetensors runs/xspecmesh-ca-small-kl/
OMP_NUM_THREADS=1 $HEADS --out runs/xspecmesh-ca-small-e16 name=xspecmesh-ca-small-e16 stages=1 stage1_epochs=16 \
  num_threads=1 > "$LOGS/xspecmesh-ca-small-e16-heads.log" 2>&1 &
OMP_NUM_THREADS=1 $HEADS --out runs/xspecmesh-ca-small-skip name=xspecmesh-ca-small-skip stages=1 stage1_epochs=16 \
  num_threads=1 skip_known_offsets=true > "$LOGS/xspecmesh-ca-small-skip-heads.log" 2>&1 &
wait
OMP_NUM_THREADS=2 $HEADS --out runs/xspecmesh-ca-small-kl name=xspecmesh-ca-small-kl backbone_loss=kl \
  > "$LOGS/xspecmesh-ca-small-kl-heads.log" 2>&1
cp -n runs/xspecmesh-ca-small-skip/stage1.safetensors runs/xspecmesh-ca-small-skipkl/  # stage 2 on the skip heads
OMP_NUM_THREADS=2 $HEADS --out runs/xspecmesh-ca-small-skipkl name=xspecmesh-ca-small-skipkl stage1_epochs=16 \
  skip_known_offsets=true backbone_loss=kl stage2_epochs=2 > "$LOGS/xspecmesh-ca-small-skipkl-heads.log" 2>&1
# lossless (rejection) rows next to the lossy one, CA + LoRA and stage-1 heads (32 meshes)
specgen benchmark --config recipes/small/bench-meshes.yaml \
  'rows=[ar,vertex,lossless,lossless-s1]' \
  'heads={vertex: xspecmesh-ca-small, lossless: xspecmesh-ca-small, lossless-s1: xspecmesh-ca-small-s1}' \
  'options.vertex={sampling: tree, top_k_tree: 1, vertex_lookup: true, draft_dtype: bfloat16}' \
  'options.lossless={criterion: rejection, sampling: tree, top_k_tree: 1, vertex_lookup: true, draft_dtype: bfloat16}' \
  'options.lossless-s1={criterion: rejection, sampling: tree, top_k_tree: 1, vertex_lookup: true, draft_dtype: bfloat16}' \
  'merged_ar=[lossless]' sweep_row=none 'tree_k=[]' 'depths=[]' 'lookups=[]' --out runs/bench-meshes-small-lossless.jsonl \
  > "$LOGS/bench-meshes-small-lossless.log" 2>&1
# which heads: s1, e16, skip (stage 1, the original backbone's distribution), kl and ce (stage 2); 64 meshes
specgen benchmark --config recipes/small/bench-meshes.yaml limit=64 \
  'rows=[ar,s1,e16,skip,kl,ce]' 'heads={s1: xspecmesh-ca-small-s1, e16: xspecmesh-ca-small-e16-s1, skip: xspecmesh-ca-small-skip-s1, kl: xspecmesh-ca-small-kl, ce: xspecmesh-ca-small}' \
  'options={criterion: rejection, sampling: tree, top_k_tree: 1, vertex_lookup: true, draft_dtype: bfloat16}' \
  'merged_ar=[kl,ce]' sweep_row=none 'tree_k=[]' 'depths=[]' 'lookups=[]' --out runs/bench-meshes-small-lossless-heads.jsonl \
  > "$LOGS/bench-meshes-small-lossless-heads.log" 2>&1
# the skip heads next to their 2-epoch KL stage 2
specgen benchmark --config recipes/small/bench-meshes.yaml limit=64 \
  'rows=[ar,skip,skipkl]' 'heads={skip: xspecmesh-ca-small-skip-s1, skipkl: xspecmesh-ca-small-skipkl}' \
  'options={criterion: rejection, sampling: tree, top_k_tree: 1, vertex_lookup: true, draft_dtype: bfloat16}' \
  'merged_ar=[skipkl]' sweep_row=none 'tree_k=[]' 'depths=[]' 'lookups=[]' --out runs/bench-meshes-small-lossless-skipkl.jsonl \
  > "$LOGS/bench-meshes-small-lossless-skipkl.log" 2>&1
# the path cut (min_path_prob) on the skip heads: uncut and cut at 0.2 / 0.3 / 0.4
specgen benchmark --config recipes/small/bench-meshes.yaml limit=64 \
  'rows=[ar,skip]' heads.skip=xspecmesh-ca-small-skip-s1 sweep_row=skip 'path_cuts=[0.2,0.3,0.4]' \
  'options={criterion: rejection, sampling: tree, top_k_tree: 1, vertex_lookup: true, draft_dtype: bfloat16}' \
  'tree_k=[]' 'depths=[]' 'lookups=[]' --out runs/bench-meshes-small-lossless-cut.jsonl \
  > "$LOGS/bench-meshes-small-lossless-cut.log" 2>&1
