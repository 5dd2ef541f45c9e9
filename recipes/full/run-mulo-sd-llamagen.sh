#!/usr/bin/env bash
# MuLo-SD on LlamaGen GPT-L c2i: the 2x and 4x up-sampler pairs on VQ-16, then the benchmark. Every step resumes
# from its run folder. Prerequisites (see the recipe headers): vq16-c2i, llamagen-c2i-l-256 and its EAGLE drafter
# (recipes/full/run-llamagen-c2i.sh l), and the low-res drafters llamagen-c2i-lowres-8x8 / -4x4, which specgen
# cannot train for ImageNet classes yet (bench-mulo-sd-llamagen-c2i-l.yaml): the dry run stops the script there.
set -euo pipefail
DEVICE=${DEVICE:-cuda}  # the trainers' device (the benchmarks' is their recipe's `device`)
R=recipes/full
specgen train-upsampler --config "$R/upsampler-llamagen-vq16-2x.yaml" --out runs/upsampler-vq16-2x --device "$DEVICE"
specgen train-upsampler --config "$R/upsampler-llamagen-vq16-4x.yaml" --out runs/upsampler-vq16-4x --device "$DEVICE"
specgen benchmark --config "$R/bench-mulo-sd-llamagen-c2i-l.yaml" --dry-run
specgen benchmark --config "$R/bench-mulo-sd-llamagen-c2i-l.yaml" --run-dir runs/bench-mulo-sd-c2i-l
specgen benchmark report runs/bench-mulo-sd-c2i-l
