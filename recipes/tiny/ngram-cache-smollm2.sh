#!/usr/bin/env bash
# The shipped n-gram cache of SmolLM2-135M-Instruct (specgen/assets/text/ngram/smollm2-135m.safetensors):
# greedy answers of the float32 target to all 3,348 built-in stdlib prompts (code) and then the 880 general prompts
# (specgen/data/general_prompts.py: advice, explanations, summaries, translation, arithmetic; never HumanEval nor the
# mixed set), 128 new tokens, 30 prompts per batch, 1 thread (~38 + ~13 min on one core of the 2-core dev VM).
# Used by `ngram` with method_options.cache=smollm2-135m (specgen/text/ngram_cache.py).
set -euo pipefail
python -m specgen.text.ngram_cache --model smollm2-135m --limit 3348 --max-new-tokens 128 --batch-size 30 \
  --threads 1 --out specgen/assets/text/ngram/smollm2-135m.safetensors
