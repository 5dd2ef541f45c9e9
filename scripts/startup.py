"""Start-to-first-output and peak RSS of `specgen generate` per model family, beside llama.cpp's load + first token.

Each row is a whole process, run `--runs` times one after another (wall seconds and the child's peak RSS, as
/usr/bin/time reports them). "warm" rows use the current $SPECGEN_HOME (built-ins converted, cost curves stored);
"cleared" rows a fresh empty home, so the first run converts the GGUF, lays out its weights and times its cost
curve. Cited by docs/results/startup.md.
Run: python scripts/startup.py [--runs 3] [--only text,int4,image,mesh,llamacpp,cleared]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from specgen.builtins import smollm2_gguf_path  # the GGUF llama.cpp loads: found here, not timed

GEN = [sys.executable, "-m", "cli.main", "generate"]
TEXT = [*GEN, "--method", "ar", "--max-new-tokens", "1", "--prompt", "hi"]
LLAMACPP = "from llama_cpp import Llama; Llama(model_path={path!r}, n_threads=1, n_ctx=512, verbose=False)('hi', max_tokens=1)"


def rows(out: str) -> dict[str, tuple[list[str], dict]]:
    """Row name -> (command, extra environment)."""
    return {
        "text float32, 1 token": (TEXT, {}),
        "text int4, 1 token": ([*TEXT, "--quantize", "int4"], {}),
        "image GPT (tiny), 1 image": ([*GEN, "--model", "tiny-image-gpt", "--method", "ar", "--classes", "0", "--num", "1", "-o", out], {}),
        "mesh GPT (tiny), 1 mesh": ([*GEN, "--model", "mesh-gpt-tiny", "--method", "ar", "--num", "1", "-o", out], {}),
        "llama.cpp Llama() + 1 token (Q4_1)": ([sys.executable, "-c", LLAMACPP.format(path=str(smollm2_gguf_path()))], {}),
        "text float32, cleared home (first run)": (TEXT, {"SPECGEN_HOME": "fresh"}),
    }


KEYS = {"text": 0, "int4": 1, "image": 2, "mesh": 3, "llamacpp": 4, "cleared": 5}


def run_once(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process (its own rusage, from wait4); a failing command stops the
    script with its stderr."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, stdout=subprocess.DEVNULL,
                                 stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            sys.exit(f"{' '.join(cmd)} failed ({child.returncode}): {err.read().strip()[-400:]}")
    return wall, usage.ru_maxrss / 1024  # Linux: KB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=",".join(KEYS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        table = list(rows(out).items())
        print("| row | wall s (each run) | peak RSS MB (each run) |\n|---|---|---|")
        for key in args.only.split(","):
            name, (cmd, env) = table[KEYS[key]]
            walls, peaks = [], []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as home:
                    got = run_once(cmd, {k: home if v == "fresh" else v for k, v in env.items()})
                walls.append(f"{got[0]:.2f}")
                peaks.append(f"{got[1]:.0f}")
            print(f"| {name} | {', '.join(walls)} | {', '.join(peaks)} |", flush=True)


if __name__ == "__main__":
    main()
