"""Run one text method over prompts: the library behind `specgen generate` for text."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specgen.data.prompts import Prompt, encode
from specgen.decoding.budget import AutoBudget
from specgen.decoding.cost import Tokens, cost_of
from specgen.decoding.stops import Stops, text_stops
from specgen.devices import DTYPES
from specgen.errors import UsageError
from specgen.limits import check_kv_cache, check_prompt_fits
from specgen.methods import run_batch
from specgen.request import DecodeRequest
from specgen.text.target import TextModel, TextSource


@dataclass
class TextGenConfig:
    """Options of `specgen generate` for text (recipe keys)."""

    method: str = "ar"
    model: str = "smollm2-135m"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    chat: bool = True
    device: str = "cpu"
    graphs: str = "auto"  # auto | on | off: CUDA-graph captured decode steps (auto: on for CUDA; models/graphs.py)
    batch_size: int = 1  # prompts decoded together (continuous batching over the prompt list)
    dtype: str | None = None  # float32 | bfloat16 (default float32; bfloat16 when quantized)
    quantize: str | None = None  # None | int8 | int4: weight-only quantized target (specgen/precision.py)
    method_options: dict = field(default_factory=dict)  # e.g. block_size, num_draft, max_ngram
    stop: list[str] = field(default_factory=list)  # stop strings: a completion ends before the first (stops.py)


@dataclass(frozen=True)
class TextResult:
    """One prompt's completion and its decoding statistics."""

    prompt: str | tuple[dict, ...]  # its Prompt's content: text, or a chat's messages
    completion: str
    token_ids: list[int]
    stats: dict


def encode_prompts(source: TextSource, req: DecodeRequest[TextGenConfig], prompts: list[Prompt]) -> list[list[int]]:
    """`prompts` as token ids (data/prompts.encode, as the benchmark encodes them), checked before the weights load
    against the context, free memory (KV cache) and the method's assets (n-gram cache vs tokenizer)."""
    cfg = req.cfg
    if req.spec.model_check is not None:
        req.spec.model_check(req.options, source.tokenizer)
    ids = [encode(source.tokenizer, p, cfg.chat) for p in prompts]
    for i, prompt_ids in enumerate(ids):
        try:
            check_prompt_fits(len(prompt_ids), cfg.max_new_tokens, source.base)
        except UsageError as e:  # which of many: its row, as --stream and the results number it (and the benchmark)
            raise UsageError(f"prompt {i}: {e}") from None
    rows = min(cfg.batch_size, len(ids))
    check_kv_cache(source.config, rows, max(map(len, ids)) + cfg.max_new_tokens, DTYPES[source.dtype], source.device)
    return ids


def generate_text(model: TextModel, req: DecodeRequest[TextGenConfig], prompts: list[Prompt], ids: list[list[int]],
                  on_done=None, on_text=None) -> list[TextResult]:
    """Decode every prompt's ids, `batch_size` at a time, prompt i from seed + i; `on_done(i)` as it finishes,
    `on_text(i, text)` with each accepted piece of its completion."""
    cfg = req.cfg
    generators = [torch.Generator().manual_seed(cfg.seed + i) for i in range(len(prompts))]
    # the drafter's seed: method_options.seed when given (checked with the options), else the run's
    seed = cfg.method_options.get("seed", cfg.seed)
    stops = text_stops(model.tokenizer, cfg.stop)
    stream = None if on_text is None else TextStream(model.tokenizer, len(prompts), on_text, stops)

    def done(i: int) -> None:  # a finished row's held-back text first, then the caller's notice
        if stream is not None:
            stream(i, [], final=True)
        if on_done is not None:
            on_done(i)

    batch = run_batch(model.target, lambda i: req.spec.drafter(req.options, seed), ids, cfg.max_new_tokens, req.params,
                      stops, generators, cfg.batch_size, on_done=done,
                      budget=draft_budget(model, req.budget, req.params.greedy), on_tokens=stream)
    texts = [model.tokenizer.decode(r.tokens) for r in batch.results]
    return [TextResult(p.content, text[: stops.cut(text)], r.tokens, r.stats.summary())
            for p, r, text in zip(prompts, batch.results, texts)]


def draft_budget(model: TextModel, kind: str, greedy: bool = True, limit: int = 16) -> AutoBudget | None:
    """None (`fixed`: each method's own draft size) or, for `auto`, an `AutoBudget` over this model's cost curve
    (it caps the method's draft size per step, never raises it); a sampled run's plans from the curve alone (`timed`
    False), so its seed repeats it."""
    return None if kind == "fixed" else AutoBudget(limit, cost_of(Tokens(model.module)), timed=greedy)


class TextStream:
    """Token ids as accepted -> each row's new text, held back while it ends in an incomplete character or in what
    may begin a stop string (`Stops.pending`), and cut before a stop string: the pieces join to the completion.

    Each call decodes only a window: the tokens since the previous call's start, `ids[start:]`, whose text past that
    of `ids[start:read]` is the new tokens' (the window's own start, a stripped leading space or a partial
    character, is in both: it cancels). The pieces equal the whole text's wherever the decoder's text of a prefix is
    the whole text's prefix (the assumption `Stops` states); decoding the whole text per call was O(n^2): 0.33 ms a
    token over 4,096 SmolLM2 tokens, a fifth of a captured GPU AR step."""

    def __init__(self, tokenizer, rows: int, on_text, stops: Stops = Stops()) -> None:
        self.tokenizer, self.on_text, self.stops = tokenizer, on_text, stops
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.start = [0] * rows  # each row's window start: the previous read's
        self.read = [0] * rows  # each row's tokens whose text is in `held` or was sent
        self.held = [""] * rows  # each row's text not sent yet (any stop string starts in it: `pending` held it)

    def __call__(self, row: int, tokens: list[int], final: bool = False) -> None:
        """`final`: the row is done, so a character or a stop string's start held back at its end goes out as it is."""
        ids = self.ids[row]
        ids.extend(tokens)
        start, read = self.start[row], self.read[row]
        window = self.tokenizer.decode(ids[start:])
        if not final and window.endswith("\ufffd"):
            return
        self.held[row] += window[len(self.tokenizer.decode(ids[start:read])):]
        self.start[row], self.read[row] = read, len(ids)
        held = self.held[row]
        end = self.stops.cut(held)
        if not final and end == len(held):  # no stop string yet: its start may be at the end
            end -= self.stops.pending(held)
        if end > 0:
            self.on_text(row, held[:end])
            self.held[row] = held[end:]
