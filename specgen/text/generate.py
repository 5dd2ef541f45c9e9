"""Run one text method over prompts: the library behind `specgen generate` for text."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.methods import get_method, run_drafter
from specgen.text.target import TextModel


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
    method_options: dict = field(default_factory=dict)  # e.g. block_size, num_draft, max_ngram


@dataclass(frozen=True)
class TextResult:
    """One prompt's completion and its decoding statistics."""

    prompt: str
    completion: str
    token_ids: list[int]
    stats: dict


def generate_text(model: TextModel, cfg: TextGenConfig, prompts: list[str], on_done=None) -> list[TextResult]:
    """Decode every prompt with cfg.method; `on_done(i)` is called after each prompt."""
    spec = get_method(cfg.method)
    if not spec.runs_on("text"):
        raise UsageError(f"method {cfg.method} is for {spec.modality}, not text")
    spec.check_options(cfg.method_options)
    if cfg.max_new_tokens < 1:
        raise UsageError(f"max-new-tokens must be >= 1, got {cfg.max_new_tokens}")
    params = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    results = []
    for i, prompt in enumerate(prompts):
        generator = torch.Generator().manual_seed(cfg.seed + i)
        drafter = spec.make_drafter({"seed": cfg.seed, **cfg.method_options})
        ids = model.tokenizer.encode(prompt, chat=cfg.chat)
        out = run_drafter(model.target, drafter, ids, cfg.max_new_tokens, params, model.tokenizer.stop_ids, generator)
        results.append(TextResult(prompt, model.tokenizer.decode(out.tokens), out.tokens, out.stats.summary()))
        if on_done:
            on_done(i)
    return results
