"""How much memory does each precision of SmolLM2-135M need? Peak RSS of a fresh process that loads the target
(the stored quantized entry already made) and greedily decodes 64 tokens of one HumanEval prompt, 1 thread.

One question; each precision runs in its own subprocess (peak RSS is per process), llama.cpp on the shipped
Q4_1 GGUF alongside when llama-cpp-python is installed. Run:
`python scripts/precision_memory.py > docs/logs/precision-memory.log`
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads(1)
from specgen.data import humaneval
spec = sys.argv[1]
if spec == "llamacpp":
    from specgen import checkpoints
    from types import SimpleNamespace as NS
    from specgen.eval.llamacpp_row import LlamaCppRow
    from specgen.decoding.stops import text_stops
    from specgen.eval.peers import PeerSetup
    from specgen.models.tokenizer import TextTokenizer
    tok = TextTokenizer.load(checkpoints.find("smollm2-135m").path)  # the tokenizer only, no weights
    target = NS(module=NS(cfg=NS(max_seq_len=2048, vocab_size=49152)))  # the row reads only these of the target
    row = LlamaCppRow(PeerSetup("llamacpp", target, {}, 64, text_stops(tok), 1, "cpu"))
    row.run(tok.encode(humaneval.build_user_message(humaneval.load_problems(1, 0)[0])))
    print(json.dumps({"spec": spec, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
else:
    from specgen.decoding.sampling import SamplingParams
    from specgen.methods import run_batch
    from specgen.methods.text import EmptyDrafter
    from specgen.text.target import load_text_model
    tm = load_text_model(spec)
    ids = tm.tokenizer.encode(humaneval.build_user_message(humaneval.load_problems(1, 0)[0]))
    run_batch(tm.target, lambda i: EmptyDrafter(), [ids], 64, SamplingParams(), tm.tokenizer.stop_ids)
    print(json.dumps({"spec": spec, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

SPECS = ("smollm2-135m", "smollm2-135m+bf16", "smollm2-135m+int8", "smollm2-135m+int4")


def main() -> None:
    for spec in SPECS:  # make the stored entries first, so that no measured process quantizes
        subprocess.run([sys.executable, "-c", "import sys; from specgen.text.target import load_text_model; "
                        "load_text_model(sys.argv[1], decode=False)", spec], check=True)
    print("# peak RSS (MB) of a process that loads the target and decodes 64 tokens (python, torch, transformers'")
    print("# tokenizer included; llamacpp: the same process around llama.cpp on the Q4_1 GGUF)")
    print("| target | peak RSS MB |")
    print("|---|---:|")
    for spec in (*SPECS, "llamacpp"):
        out = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True)
        if out.returncode:
            last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
            print(f"| {spec} | failed: {last} |")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {spec} | {row['peak_rss_mb']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
