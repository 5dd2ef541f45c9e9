"""`specgen generate`: decode prompts (text) with any method; completions on stdout, stats on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import _output
from cli._errors import command
from cli._options import ConfigOpt, DeviceOpt, Format, FormatOpt, MethodOpt, ModelOpt, OverridesArg, QuietOpt, SeedOpt

EPILOG = """examples:

  specgen generate --prompt "Write a function that reverses a string."

  specgen generate --method ngram --prompts prompts.txt --format json | jq .completion

  echo "Sort a list in Python" | specgen generate --method jacobi --prompts - method_options.block_size=4

  specgen generate --config recipes/tiny/generate-text.yaml max_new_tokens=64
"""

STAT_COLUMNS = ["method", "new_tokens", "nfe", "tpf", "tau", "tokens_per_s", "wall_s"]


@command
def generate(
    overrides: OverridesArg = None,
    method: MethodOpt = None,
    model: ModelOpt = None,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", "-p", help="Prompt text (repeatable).")] = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", help="Prompt file: one per line, JSONL, or - for stdin.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Token budget per prompt.")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", "-t", help="0 = greedy.")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass in (0, 1].")] = None,
    no_chat: Annotated[bool, typer.Option("--no-chat", help="Feed prompts raw, without the chat template.")] = False,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
) -> None:
    """Generate with a decoding method; lossless methods give exactly the target's output."""
    from specgen.config import load_config
    from specgen.data.prompts import read_prompts
    from specgen.errors import UsageError
    from specgen.text.generate import TextGenConfig, generate_text
    from specgen.text.target import load_text_model

    cfg = load_config(TextGenConfig, config, overrides, method=method, model=model, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, device=device,
                      chat=False if no_chat else None)
    texts = list(prompt or [])
    if prompts:
        texts += read_prompts(prompts)
    if not texts:
        raise UsageError("no prompt given: use --prompt TEXT or --prompts FILE (or - for stdin)")
    from specgen.decoding.sampling import SamplingParams
    from specgen.methods import get_method

    get_method(cfg.method).check_options(cfg.method_options)
    SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)  # validate before loading the model
    tm = load_text_model(cfg.model, cfg.device, _output.registry_progress(quiet))
    with _output.progress(f"{cfg.method}", len(texts), quiet or fmt == Format.json) as advance:
        results = generate_text(tm, cfg, texts, on_done=lambda i: advance())
    for r in results:
        if fmt == Format.json:
            _output.emit_json({"prompt": r.prompt, "completion": r.completion, "method": cfg.method,
                               "model": tm.entry.ref, "token_ids": r.token_ids, "stats": r.stats})
        else:
            _output.out.print(r.completion, markup=False)
            _output.out.print()
    if not quiet and fmt == Format.table:
        rows = [{"method": cfg.method, **r.stats} for r in results]
        _output.table(f"{cfg.method} on {tm.entry.ref}", rows, STAT_COLUMNS)
