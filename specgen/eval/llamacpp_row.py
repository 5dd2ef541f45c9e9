"""The `llamacpp` and `llamacpp-lookup` peer rows: llama.cpp greedy on a GGUF (plain, prompt lookup), optional."""

from __future__ import annotations

import atexit
import time
from pathlib import Path
from typing import Iterable

from specgen.builtins import smollm2_gguf_path
from specgen.decoding.stops import Stops
from specgen.errors import IncompatibleError, UsageError
from specgen.eval.peers import OneAtATime, PeerSetup
from specgen.eval.text_rows import Run

INSTALL = ("pip install llama-cpp-python: it compiles llama.cpp; where its repacked AMX/AVX512 path crashes, build "
           "with CMAKE_ARGS=\"-DGGML_CPU_REPACK=OFF\" or set options.llamacpp.repack=false; docs/precision.md")


class LlamaCppRow(OneAtATime):
    """One llama_cpp.Llama for the whole benchmark (closed at exit). Options: `gguf` (default: the shipped SmolLM2
    GGUF), `repack` (default true; false skips llama.cpp's runtime repacking, the path that crashed on some CPUs)."""

    OPTIONS: tuple[str, ...] = ("gguf", "repack")
    module = None  # the GGUF's weights are not torch's: no roofline row
    lossless = False  # the GGUF's quantized weights, not the target's

    @staticmethod
    def unavailable(setup: PeerSetup) -> str | None:
        """Why the rows cannot run here (one line), or None."""
        try:
            import llama_cpp  # noqa: F401  (optional dependency)
        except ImportError:
            return f"{setup.name} row skipped: llama-cpp-python is not installed ({INSTALL})"
        return None

    def __init__(self, setup: PeerSetup) -> None:
        import llama_cpp  # optional dependency

        options, cfg, threads = setup.options, setup.original.module.cfg, setup.threads
        path = Path(options["gguf"]).expanduser() if options.get("gguf") else smollm2_gguf_path()
        if not path.is_file():
            raise UsageError(f"{setup.name} row: no GGUF file at {path}")
        low = llama_cpp.llama_cpp
        default = low.llama_model_default_params
        if not options.get("repack", True):  # Llama() has no argument for it: its defaults are read from this function
            def no_repack():
                params = default()
                params.use_extra_bufts = False
                return params

            low.llama_model_default_params = no_repack
        try:
            self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=cfg.max_seq_len, n_threads=threads,
                                       n_threads_batch=threads, n_batch=min(cfg.max_seq_len, 2048), verbose=False,
                                       seed=0, draft_model=self.draft(options))
        finally:
            low.llama_model_default_params = default
        atexit.register(self.llm.close)  # before interpreter teardown: llama-cpp-python's own finaliser fails then
        if self.llm.n_vocab() != cfg.vocab_size:
            raise IncompatibleError(f"{setup.name} row: {path.name} has {self.llm.n_vocab()} tokens, the target "
                                    f"{cfg.vocab_size}")
        self.setup, self.evals = setup, 0
        evaluate = self.llm.eval

        def counting(tokens):  # generate() calls self.eval once per step: the row's forwards
            self.evals += 1
            return evaluate(tokens)

        self.llm.eval = counting

    def draft(self, options: dict):
        """The draft model llama-cpp-python's generate() speculates with (None: plain greedy)."""
        return None

    def run(self, prompt: list[int]) -> Run:
        """llama.cpp's greedy decoding of `prompt` (token ids); tokens past one per step were accepted drafts."""
        t0 = time.perf_counter()
        self.llm.reset()
        self.evals = 0
        stream = self.llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True)
        tokens = taken(stream, self.setup.stops, self.setup.max_new_tokens)
        seconds = time.perf_counter() - t0
        return Run(tokens, seconds, self.evals, self.evals - 1, max(0, len(tokens) - self.evals))


def taken(stream: Iterable[int], stops: Stops, limit: int) -> list[int]:
    """The tokens of llama.cpp's `stream` a row keeps, each looked at as it comes (the stream then stops: nothing
    more is decoded): `Stops.kept`'s, through a stop id (kept, as specgen's rows keep it: exact match and tokens
    counted compare like with like) or the token that completes a stop string, at most `limit`. `generate` yields
    its eos like any token; its completion API is what leaves it out."""
    tokens: list[int] = []
    for tok in stream:
        tokens.append(int(tok))
        if len(tokens) >= limit or stops.end(tokens, len(tokens) - 1, limit) is not None:
            break
    return tokens


class LlamaCppLookup(LlamaCppRow):
    """`llamacpp-lookup`: llama.cpp's prompt-lookup decoding. Options, besides llamacpp's: LlamaPromptLookupDecoding's
    own, num_pred_tokens and max_ngram_size (default: its defaults)."""

    OPTIONS = (*LlamaCppRow.OPTIONS, "num_pred_tokens", "max_ngram_size")

    def draft(self, options: dict):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # optional dependency

        return LlamaPromptLookupDecoding(**{k: int(v) for k, v in options.items()
                                            if k in ("num_pred_tokens", "max_ngram_size")})
