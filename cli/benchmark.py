"""`specgen benchmark`: methods side by side in one process; a Rich table on stderr, rows on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import _output, benchmark_image, benchmark_mesh
from cli._errors import command
from cli._options import (ConfigOpt, DeviceOpt, DtypeOpt, Format, FormatOpt, ModelOpt, OverridesArg, QuantizeOpt,
                          QuietOpt, SeedOpt)

EPILOG = """examples:

  specgen benchmark --suite humaneval --methods ar,jacobi,ngram,hf --limit 20

  specgen benchmark --suite humaneval --methods ar,ngram --limit 5 --format json | jq '.[] | .speedup_vs_ar'

  specgen benchmark --config recipes/tiny/bench-humaneval.yaml --out rows.jsonl method_options.ngram.num_draft=3

  specgen benchmark --suite humaneval --methods ar,jacobi,cllm,pcllm,pcllm-mr --limit 20   # distilled models vs the original AR

  specgen benchmark --suite humaneval --methods ar,ngram,hf --limit 32 --batch-size 1,4,16   # throughput

  specgen benchmark --suite images --limit 16        # ar, eagle2, adt-tree, lantern, adt-tree+lantern at T=0 and T=1
"""

COLUMNS = ["method", "model", "tokens_per_s", "speedup_vs_ar", "tpf", "tau", "efficiency", "nfe", "exact_match_vs_ar",
           "exact_match_vs_own_ar", "prefix_vs_ar", "nll_base", "pass_at_1"]
BATCH_COLUMNS = ["batch_size", "method", "model", "throughput_tokens_per_s", "throughput_vs_ar", "throughput_vs_ar_b1",
                 "decode_tokens_per_s",
                 "latency_median_s", "latency_p90_s", "tpf", "tau", "c_batch", "exact_match_vs_ar",
                 "exact_match_vs_ar_b1", "nll_base", "pass_at_1"]
SUITES = ("humaneval", "images", "meshes")
OTHER_SUITES = {"meshes": benchmark_mesh.run, "images": benchmark_image.run}  # suites with their own runner: name -> run(**options)


@command
def benchmark(
    overrides: OverridesArg = None,
    suite: Annotated[Optional[str], typer.Option("--suite", help=f"Benchmark suite: {', '.join(SUITES)}.")] = None,
    methods: Annotated[Optional[str], typer.Option("--methods", help="Comma-separated methods; 'ar' is the reference.")] = None,
    model: ModelOpt = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Number of prompts.")] = None,
    offset: Annotated[Optional[int], typer.Option("--offset", help="Skip this many prompts first.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Token budget per prompt.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads (0 = default).")] = None,
    batch_size: Annotated[Optional[str], typer.Option(
        "--batch-size", help="Batch sizes, comma-separated (e.g. 1,4,16): B slots of continuous batching (B > 1 "
                            "rows add throughput and latency).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Also write the rows as JSONL to this new file (an "
                                                "existing file or a folder is refused before any work).")] = None,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    quantize: QuantizeOpt = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
) -> None:
    """Measure speed (ratios from one run), acceptance and quality of methods on a suite."""
    if methods is not None and not [m for m in methods.split(",") if m.strip()]:
        from specgen.errors import UsageError

        raise UsageError(f"--methods {methods!r} names no method; give a comma-separated list such as ar,ngram")
    suite = suite or recipe_suite(config)
    if suite in OTHER_SUITES:
        if batch_size is not None:  # the images and meshes suites read batch sizes from their configs
            overrides = [*(overrides or []), f"batch_sizes=[{','.join(map(str, parse_batch_sizes(batch_size)))}]"]
        if dtype or quantize:
            from specgen.errors import UsageError

            raise UsageError(f"--dtype/--quantize are for the humaneval suite for now, not {suite}")
        return OTHER_SUITES[suite](**{k: v for k, v in locals().items()
                                      if k not in ("suite", "batch_size", "dtype", "quantize")})
    from specgen.config import load_config
    from specgen.errors import UsageError
    from specgen.eval.text_bench import TextBenchConfig, check_methods, run_text_benchmark
    from specgen.text.target import load_text_model

    cfg = load_config(TextBenchConfig, config, overrides, suite=suite, model=model, limit=limit, offset=offset,
                      max_new_tokens=max_new_tokens, threads=threads, seed=seed, device=device,
                      methods=[m.strip() for m in methods.split(",") if m.strip()] if methods else None,
                      batch_sizes=parse_batch_sizes(batch_size), dtype=dtype, quantize=quantize)
    if cfg.suite not in SUITES:
        from specgen.errors import UnknownNameError

        raise UnknownNameError("suite", cfg.suite, list(SUITES))
    if cfg.limit < 1 or cfg.offset < 0:
        raise UsageError("--limit must be >= 1 and --offset >= 0")
    check_methods(cfg)
    _output.check_rows_path(out)
    tm = load_text_model(cfg.model, cfg.device, _output.registry_progress(quiet), dtype=cfg.dtype, quantize=cfg.quantize)
    with _output.progress(f"benchmark {cfg.suite}", cfg.limit * len(cfg.batch_sizes),
                          quiet or fmt == Format.json) as advance:
        rows = run_text_benchmark(tm, cfg, on_prompt=lambda i: advance())
    for r in rows:  # a row that cannot run here (llamacpp without llama-cpp-python): its one line, then dropped
        if r.get("skipped"):
            _output.err.print(r["skipped"], markup=False, soft_wrap=True)
    rows = [r for r in rows if not r.get("skipped")]
    machine = _output.machine_label()
    for r in rows:
        r["machine"] = machine
    _output.write_rows(out, rows)
    if fmt == Format.json:
        _output.emit_json(rows)
    else:
        title = (f"{cfg.suite}: {tm.entry.ref}, {cfg.limit} prompts from {cfg.offset}, greedy, "
                 f"max {cfg.max_new_tokens} new tokens ({machine})")
        single = [r for r in rows if r["batch_size"] == 1]
        if single:
            _output.table(title, single, COLUMNS, _output.out)
        if len(single) < len(rows):
            _output.table(f"{title}, batched (throughput over the batch, latency per sequence)", rows, BATCH_COLUMNS,
                          _output.out)


def parse_batch_sizes(text: str | None) -> list[int] | None:
    """'1,4,16' -> [1, 4, 16]; None when the option is not given."""
    if text is None:
        return None
    from specgen.errors import UsageError

    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--batch-size takes comma-separated integers >= 1, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--batch-size takes comma-separated integers >= 1, got {text!r}")
    return sizes


def recipe_suite(config: Path | None) -> str | None:
    """The `suite` key of a recipe file, so `--config` alone picks the right runner."""
    if config is None or not config.is_file():
        return None
    import yaml

    try:
        doc = yaml.safe_load(config.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return None  # the config loader reports the syntax error (or the unreadable file)
    return doc.get("suite") if isinstance(doc, dict) else None
