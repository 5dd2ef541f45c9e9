#!/usr/bin/env bash
# The checks a CUDA machine runs (the project's CI has none), in one call of under 10 minutes: the gpu-marked tests,
# captured steps against eager ones and the peers (`gpu_graphs.py`: text, image, mesh, paper shapes; its table and
# issue 46's goals, met or not, are the summary printed last), where a captured step's time goes (`gpu_profile.py`:
# kernels a step, text AR at batch 1 and 16, pcllm-mr, image AR / ADT-Tree / EAGLE-2, mesh AR / XSpecMesh) and host syncs per decode step. More steps by name: attention (Triton lists vs chunked vs
# SDPA, SlicedLinear vs one GEMM: speed, and bitwise AR = verify in bf16), images, meshes, batch-throughput,
# auto-trace. Each step has its own time limit and log under $OUT (default runs/gpu-check); a failing step does not
# stop the next.
#
# On a bare GPU machine with PyTorch but without this project's lighter dependencies, put their wheels in .whl/
# (omegaconf, antlr4-python3-runtime==4.9.3, trimesh, gguf; pytest-xdist and execnet to run the gpu tests' files four at
# once) and they are installed to /tmp/site first: `pip wheel -q --no-deps -w .whl NAME...` on a machine with an index.
# Run from the repository root: `bash scripts/gpu_check.sh`; `ONLY="sync-count images"` runs the named steps alone.
# A short rerun narrows the steps: SUITES (gpu_graphs.py's, default text,image,mesh,scale; its `hf-compiled` warm-up
# runs only with text), MESH_TREES (more candidate trees its mesh suite times) and TESTS and PROFILE (pytest's `-k`
# expression, gpu_profile.py's suites), e.g.
# `ONLY="gpu-tests graphs profile" SUITES=image,mesh TESTS=mesh PROFILE=mesh bash scripts/gpu_check.sh`.
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=250
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD
fi
mkdir -p /tmp/specgen-bin  # `timeout` runs programs, not shell functions: a two-line `specgen` for this checkout
printf '#!/bin/sh\nexec python3 -m cli.main "$@"\n' >/tmp/specgen-bin/specgen && chmod +x /tmp/specgen-bin/specgen
export PATH=/tmp/specgen-bin:$PATH PYTHONPATH=${PYTHONPATH:-$PWD}
runs() {  # runs NAME: whether ONLY (default: the four steps below) names it
    case " ${ONLY:-gpu-tests graphs profile sync-count} " in *" $1 "*) return 0 ;; esac; return 1
}
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, print the tail
    local name=$1 limit=$2; shift 2
    runs "$name" || return 0
    echo "== $name"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "rc $? after $((SECONDS - t0)) s"
    tail -n 25 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
# the `hf-compiled` peer's compile (minutes, at the end of the graphs step's limit at the sixth lease) runs first in a
# process of its own beside the gpu tests (4 of the host's cores), untimed: the graphs step's compile then reads
# Inductor's on-disk caches
SUITES=${SUITES:-text,image,mesh,scale}
if runs graphs && [[ ",$SUITES," == *,text,* ]]; then
    TORCHINDUCTOR_COMPILE_THREADS=4 timeout 140 python3 scripts/gpu_graphs.py --only hf-warm >"$OUT/hf-warm.log" 2>&1 &
    warm=$!
fi
# a test module that cannot import (a missing wheel: trimesh) fails alone, not the whole collection
# 183 gpu tests (53 s for 60 at the sixth lease, 55 s for 125 at the seventh; since, the method table's text methods at
# both option defaults through graphs and more targets' blocks, less the one-launch products' in session 68):
# a test file a process, four at once where pytest-xdist imports (its wheels in .whl/: execnet, pytest-xdist), so the
# files' Triton compiles run side by side
# the four default steps' limits sum to 580 s: the device tool's 600 s a command, less the set-up
par=$(python3 -c 'import xdist' >/dev/null 2>&1 && echo "-n 4 --dist loadfile")
[ -n "$SKIP_TESTS" ] || step gpu-tests 140 python3 -m pytest -m gpu tests -v -rfE -p no:cacheprovider \
    --continue-on-collection-errors $par ${TESTS:+-k "$TESTS"}
[ -z "$warm" ] || { wait "$warm"; echo "hf-warm rc $?: $(grep -o '"warmup_s": [0-9.]*' "$OUT/hf-warm.log")"; }
# the graphs step (the issue's table) gets what the steps before it left of the 580 s, less the 130 s of the two after
# it, and never under 340 s
left=$((580 - SECONDS - 130))
limit=$((left > 340 ? left : 340))
step graphs $limit python3 scripts/gpu_graphs.py --only "$SUITES" --json "$OUT/graphs.json" \
    --deadline $limit ${MESH_TREES:+--mesh-trees $MESH_TREES}
step profile 90 python3 scripts/gpu_profile.py ${PROFILE:+--only "$PROFILE"}
step sync-count 40 python3 scripts/gpu_sync_count.py --device cuda
step attention 80 python3 scripts/gpu_graphs.py --only attention --json "$OUT/attention.json"
step images 150 specgen benchmark --config recipes/tiny/bench-images-batch.yaml --device cuda --threads 0 \
    --batch-size 1,8 num=8 out_dir=/tmp/gpu-check-images --out "$OUT/images.jsonl"
step meshes 100 specgen benchmark --config recipes/tiny/bench-meshes-batch.yaml --device cuda --threads 0 \
    --batch-size 1,8 --limit 8 --out "$OUT/meshes.jsonl"
step batch-throughput 150 python3 scripts/gpu_batch_throughput.py --device cuda --dtype bfloat16 --batches 1,4,16 \
    --json "$OUT/batch-throughput.json"
step auto-trace 100 python3 scripts/auto_budget_trace.py --device cuda --method eagle2 --threads 0
echo "== summary"
grep -E "passed|failed" "$OUT/gpu-tests.log" 2>/dev/null | tail -n 1
sed -n '/^| suite /,$p' "$OUT/graphs.log" 2>/dev/null
sed -n '/^| suite /,$p' "$OUT/attention.log" 2>/dev/null | tail -n +3
grep -A 4 " ms a step " "$OUT/profile.log" 2>/dev/null
