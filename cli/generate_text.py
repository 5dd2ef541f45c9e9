"""Text runner of `specgen generate`: completions on stdout (streamed with --stream or to a terminal), stats on stderr."""

from __future__ import annotations

import numpy as np

from cli import _output, _stream
from cli._options import Format
from specgen.config import load_config
from specgen.data.prompts import Prompt, read_prompt_records
from specgen.errors import UsageError
from specgen.generate.text import TextGenConfig, encode_prompts, generate_text
from specgen.methods import MethodSpec, model_for
from specgen.request import parse_request
from specgen.text.target import open_text_model

STAT_COLUMNS = ["method", "new_tokens", "nfe", "tpf", "tau", "tokens_per_s", "wall_s"]
BATCH_COLUMNS = ["method", "sequences", "new_tokens", "throughput_tokens_per_s", "latency_median_s", "latency_p90_s"]


def run(args, spec: MethodSpec) -> None:
    cfg = load_config(TextGenConfig, args.config, args.overrides, spec, method=spec.name,
                      max_new_tokens=args.max_new_tokens, chat=args.chat, stop=args.stop,
                      **args.recipe)
    req = parse_request(cfg, "text", spec)  # before the model loads: a bad option costs no load
    # a prompt file through the benchmark's reader: what `benchmark --prompts` reads, generate reads (chats included)
    if args.prompt_field is not None and args.prompts_file is None:
        raise UsageError("--prompt-field names a field of a --prompts file (JSON Lines or a dataset); give the file")
    prompts = [Prompt(t) for t in args.prompts] + (read_prompt_records(args.prompts_file, args.prompt_field)
                                                    if args.prompts_file else [])
    if not prompts:
        raise UsageError("no prompt given: use --prompt TEXT or --prompts FILE (or - for stdin)")
    model = model_for(spec, cfg.model, TextGenConfig.model)  # distilled methods: their model
    progress = _output.registry_progress(args.quiet)
    source = open_text_model(model, req.device, progress, dtype=cfg.dtype, quantize=cfg.quantize)
    ids = encode_prompts(source, req, prompts)  # context and KV cache checked before the weights load
    tm = source.load(progress, graphs=cfg.graphs)
    sink = _stream.sink_for(args.stream, args.fmt == Format.table, len(prompts))

    def done(i: int) -> None:
        advance()
        if sink is not None:
            sink.done(i)

    # a bar on the terminal the text streams to would cut through it
    quiet = args.quiet or args.fmt == Format.json or sink is not None
    with _output.progress(spec.name, len(prompts), quiet) as advance:
        try:
            results = generate_text(tm, req, prompts, ids, on_done=done, on_text=sink)
        except KeyboardInterrupt:
            if sink is not None:
                sink.interrupted()
            raise
    for r in [] if sink is not None else results:  # streamed: the pieces were the output
        if args.fmt == Format.json:
            _output.emit_json({"prompt": r.prompt, "completion": r.completion, "method": spec.name,
                               "model": tm.entry.ref, "token_ids": r.token_ids, "stats": r.stats})
        else:
            _output.emit_text(r.completion, end="\n\n")
    if not args.quiet and (args.fmt == Format.table or sink is not None):  # streamed: no JSON results hold them
        _output.table(f"{spec.name} on {tm.entry.ref}", [{"method": spec.name, **r.stats} for r in results],
                      STAT_COLUMNS)
        if cfg.batch_size > 1:  # throughput: tokens / time to the last finish; latency per sequence, queueing included
            latency = [r.stats["latency_s"] for r in results]
            tokens = sum(r.stats["new_tokens"] for r in results)
            _output.table(f"batch of {min(cfg.batch_size, len(results))} slots", [{
                "method": spec.name, "sequences": len(results), "new_tokens": tokens,
                "throughput_tokens_per_s": tokens / max(latency), "latency_median_s": float(np.percentile(latency, 50)),
                "latency_p90_s": float(np.percentile(latency, 90))}], BATCH_COLUMNS)
