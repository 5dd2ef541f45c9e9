#!/usr/bin/env bash
# EAGLE-2 / ADT-Tree / LANTERN / VVS on LlamaGen c2i 256 px: import, drafter, dry run, benchmark, report.
#   recipes/full/run-llamagen-c2i.sh l     (GPT-L: ADT-Tree Table V)      recipes/full/run-llamagen-c2i.sh b   (GPT-B)
# Needs the released files in $CKPT (default ./checkpoints): vq_ds16_c2i.pt and c2i_B_256.pt / c2i_L_256.pt
# (FoundationVision/LlamaGen). They are read with torch.load(weights_only=True) and converted to safetensors by
# `specgen registry import`; nothing is unpickled. Imports are skipped when the entry exists; steps resume.
set -euo pipefail
DEVICE=${DEVICE:-cuda}  # the trainers' device (the benchmarks' is their recipe's `device`)
S=${1:-l}
case "$S" in b) G=GPT-B; F=c2i_B_256.pt ;; l) G=GPT-L; F=c2i_L_256.pt ;; *) echo "usage: $0 b|l" >&2; exit 2 ;; esac
CKPT=${CKPT:-checkpoints}
R=recipes/full
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
has() { specgen registry list --format json | python -c "import json,sys; sys.exit(0 if any(r['name']=='$1' and r['installed'] for r in json.load(sys.stdin)) else 1)"; }
echo '{}' > "$TMP/vq16.json"
has vq16-c2i || specgen registry import "$CKPT/vq_ds16_c2i.pt" --kind vq --name vq16-c2i --builder vq --kwargs "$TMP/vq16.json"
echo "{\"gpt_model\": \"$G\", \"model_type\": \"c2i\", \"grid\": 16}" > "$TMP/c2i.json"
has "llamagen-c2i-$S-256" || specgen registry import "$CKPT/$F" --name "llamagen-c2i-$S-256" --builder llamagen-gpt \
  --kwargs "$TMP/c2i.json" --vq vq16-c2i
specgen train-heads --kind eagle --config "$R/eagle-llamagen-c2i-$S.yaml" --out "runs/eagle-llamagen-c2i-$S" \
  --device "$DEVICE"
specgen benchmark --config "$R/bench-llamagen-c2i-$S.yaml" --dry-run
specgen benchmark --config "$R/bench-llamagen-c2i-$S.yaml" --run-dir "runs/bench-llamagen-c2i-$S"
specgen benchmark report "runs/bench-llamagen-c2i-$S"
