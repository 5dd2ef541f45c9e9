"""Text runner of `specgen generate`: completions on stdout (text or JSON lines), stats table on stderr."""

from __future__ import annotations

from cli import _output
from cli._options import Format

STAT_COLUMNS = ["method", "new_tokens", "nfe", "tpf", "tau", "tokens_per_s", "wall_s"]


def run(req) -> None:
    from specgen.config import load_config
    from specgen.data.prompts import read_prompts
    from specgen.decoding.sampling import SamplingParams
    from specgen.errors import UsageError
    from specgen.methods import get_method
    from specgen.text.generate import TextGenConfig, check_batching, generate_text
    from specgen.text.target import load_text_model

    cfg = load_config(TextGenConfig, req.config, req.overrides, method=req.method, model=req.model,
                      max_new_tokens=req.max_new_tokens, temperature=req.temperature, top_k=req.top_k,
                      top_p=req.top_p, seed=req.seed, device=req.device, chat=req.chat,
                      batch_size=req.batch_size, dtype=req.dtype, quantize=req.quantize)
    texts = list(req.prompts)
    if req.prompts_file:
        texts += read_prompts(req.prompts_file)
    if not texts:
        raise UsageError("no prompt given: use --prompt TEXT or --prompts FILE (or - for stdin)")
    get_method(cfg.method).check_options(cfg.method_options)
    SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)  # validate before loading the model
    check_batching(cfg.max_new_tokens, cfg.batch_size)
    from specgen.methods import model_for

    model = model_for(get_method(cfg.method), cfg.model, TextGenConfig.model)  # distilled methods: their model
    tm = load_text_model(model, cfg.device, _output.registry_progress(req.quiet), dtype=cfg.dtype,
                         quantize=cfg.quantize)
    with _output.progress(cfg.method, len(texts), req.quiet or req.fmt == Format.json) as advance:
        results = generate_text(tm, cfg, texts, on_done=lambda i: advance())
    for r in results:
        if req.fmt == Format.json:
            _output.emit_json({"prompt": r.prompt, "completion": r.completion, "method": cfg.method,
                               "model": tm.entry.ref, "token_ids": r.token_ids, "stats": r.stats})
        else:
            _output.out.print(r.completion, markup=False)
            _output.out.print()
    if not req.quiet and req.fmt == Format.table:
        _output.table(f"{cfg.method} on {tm.entry.ref}", [{"method": cfg.method, **r.stats} for r in results],
                      STAT_COLUMNS)
        if cfg.batch_size > 1:
            _output.table(f"batch of {min(cfg.batch_size, len(results))} slots", [batch_row(cfg.method, results)],
                          BATCH_COLUMNS)


BATCH_COLUMNS = ["method", "sequences", "new_tokens", "throughput_tokens_per_s", "latency_median_s", "latency_p90_s"]


def batch_row(method: str, results) -> dict:
    """Throughput over the whole batch (tokens / time to the last finish) and per-sequence latency (queueing included)."""
    from specgen.eval.latency import percentile

    latency = [r.stats["latency_s"] for r in results]
    tokens = sum(r.stats["new_tokens"] for r in results)
    return {"method": method, "sequences": len(results), "new_tokens": tokens,
            "throughput_tokens_per_s": tokens / max(latency), "latency_median_s": percentile(latency, 50),
            "latency_p90_s": percentile(latency, 90)}
