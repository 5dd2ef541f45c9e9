#!/usr/bin/env bash
# pcLLM on Qwen2.5-Coder-7B-Instruct end to end on one 8-GPU node (paper sec. 4.1, Table 1): collect n=16
# trajectories -> distill round 1 -> collect n=32 from the round-1 model -> distill round 2 -> benchmark.
# Every step resumes from its output folder: rerun this script after an interruption.
# Before: specgen registry import /path/to/Qwen2.5-Coder-7B-Instruct --name qwen2.5-coder-7b
#         and the prompts file data/opencodeinstruct-450k.jsonl (see recipes/full/pcllm-qwen2.5-coder-collect.yaml).
# GPUS=8 by default; the distill steps need sharded training for full fine-tuning (see the recipe headers).
set -euo pipefail
GPUS=${GPUS:-8}
R=recipes/full
torchrun --nproc-per-node "$GPUS" -m cli.main collect-trajectories --config "$R/pcllm-qwen2.5-coder-collect.yaml" \
  --out runs/qc-traj-n16
specgen collect-trajectories --out runs/qc-traj-n16 --merge
accelerate launch --num_processes "$GPUS" -m cli.main distill --config "$R/pcllm-qwen2.5-coder.yaml" --out runs/qc-r1
torchrun --nproc-per-node "$GPUS" -m cli.main collect-trajectories --config "$R/pcllm-qwen2.5-coder-collect.yaml" \
  --out runs/qc-traj-n32 model=pcllm-qwen2.5-coder-7b block_size=32
specgen collect-trajectories --out runs/qc-traj-n32 --merge
accelerate launch --num_processes "$GPUS" -m cli.main distill --config "$R/pcllm-qwen2.5-coder-r2.yaml" --out runs/qc-r2
specgen benchmark --config "$R/bench-pcllm-qwen2.5-coder.yaml" --dry-run   # exits 1 if an entry is missing
specgen benchmark --config "$R/bench-pcllm-qwen2.5-coder.yaml" --run-dir runs/bench-pcllm-qc
specgen benchmark report runs/bench-pcllm-qc
