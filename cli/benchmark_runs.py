"""`specgen benchmark`'s one run path: suites as strategies, shards, run folders, rows as JSONL, JSON or tables."""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import typer

from cli import _output
from cli._options import Format
from specgen import devices
from specgen.config import load_config, read_recipe
from specgen.errors import UsageError
from specgen.eval import image_bench, mesh_bench, text_bench
from specgen.eval.dry_run import check_recipe, picked_rows, recipe_advice, row
from specgen.eval.graph_use import timed_note
from specgen.eval.image_bench import (ImageBenchConfig, check_classifier, check_out_dir, checked_rows, image_rows_of,
                                      measure_images, write_outputs)
from specgen.eval.mesh_bench import MeshBenchConfig, measure_meshes, mesh_rows_of, variants
from specgen.eval.run_dir import Grid, RunDir, RunNotFinished, defaults_of, wait_for_ranks
from specgen.eval.text_bench import (TextBenchConfig, UnregisteredRowModel, check_prompts_fit, check_row_models,
                                     measure, plan, prompts_said, resolved_of, rows_of, stops_said)
from specgen.generate.image import load_image_model
from specgen.machine import label, machine_facts
from specgen.models.graphs import check_mode
from specgen.paths import file_digest
from specgen.shard import Shard, launcher_shard, parse_shard
from specgen.text.target import load_text_model

Table = tuple[str, list[dict], list[str]]  # (title, rows, columns)


def every(row: dict) -> bool:
    """A run's rows are all shown (`finish`): a report's --methods shows some."""
    return True


class Suite(Protocol):
    """One suite: its config, its plan (every row checked and expanded), what is left, the measuring, rows, tables."""

    config_type: type
    row_key: str  # the field of a row holding its name (what `--methods` names)

    def plan(self, cfg, resolved: dict | None = None) -> Any: ...  # a bad row is one line before any work

    def resolved(self, plan) -> dict | None: ...  # what a run folder keeps of the plan beyond the config (RunDir)

    def grids(self, plan) -> list[Grid]: ...  # the run's items (record keys)

    def measure(self, plan, sink, shard: Shard, on_item: Callable, machine: Callable[[], str], quiet: bool) -> None: ...

    # RunNotFinished while items lack records; the rows `shown` keeps (a report's --methods), and only their files
    def finish(self, plan, sink, quiet: bool, shown: Callable[[dict], bool] = every) -> list[dict]: ...

    def tables(self, rows: list[dict], plan, sink) -> list[Table]: ...


class TextSuite:
    """humaneval and text: every method interleaved per prompt (specgen/eval/text_bench.py)."""

    config_type = TextBenchConfig
    row_key = "method"
    COLUMNS = ["category", "method", "model", "tokens_per_s", "speedup_vs_ar", "tpf", "tau", "efficiency",
               "weight_mb_per_token", "bandwidth_share", "nfe", "exact_match_vs_ar", "exact_match_vs_own_ar",
               "prefix_vs_ar", "nll_base", "pass_at_1"]
    BATCH_COLUMNS = ["batch_size", "method", "model", "throughput_tokens_per_s", "throughput_vs_ar",
                     "throughput_vs_ar_b1", "decode_tokens_per_s", "latency_median_s", "latency_p90_s", "tpf", "tau",
                     "c_batch", "exact_match_vs_ar", "exact_match_vs_ar_b1", "nll_base", "pass_at_1"]

    plan = staticmethod(plan)
    resolved = staticmethod(resolved_of)

    def grids(self, p) -> list[Grid]:
        return [text_bench.grid(p)]

    def measure(self, p, sink, shard: Shard, on_item, machine, quiet: bool) -> None:
        check_prompts_fit(p, _output.registry_progress(quiet))  # from the entry's files, before the weights load
        check_row_models(p, _output.registry_progress(quiet))
        cfg = p.cfg
        tm = load_text_model(cfg.model, cfg.device, _output.registry_progress(quiet), dtype=cfg.dtype,
                             quantize=cfg.quantize, graphs=cfg.graphs)
        measure(tm, p, sink, shard, on_item, machine)

    def finish(self, p, sink, quiet: bool, shown=every) -> list[dict]:
        rows = [r for r in rows_of(p, sink) if shown(r)]
        for why in sink.skipped_rows().values():  # a row that cannot run here: its one line, then no row
            _output.err.print(why, markup=False, soft_wrap=True)
        return rows

    def tables(self, rows: list[dict], p, sink) -> list[Table]:
        cfg = p.cfg
        source = f" of {cfg.prompts or 'the mixed set'}" if cfg.suite == "text" else ""
        stop = f"stop {stops_said(cfg)}" if cfg.stop else ""
        how = "".join(f", {said}" for said in (prompts_said(cfg), "greedy", stop) if said)
        title = (f"{cfg.suite}: {cfg.model}, {rows[0]['prompts'] if rows else 0} prompts{source} from {cfg.offset}"
                 f"{how}, max {cfg.max_new_tokens} new tokens ({machine_of(sink)}{roofline_note(sink)})")
        single = [r for r in rows if r["batch_size"] == 1]
        columns = self.COLUMNS if any("category" in r for r in single) else self.COLUMNS[1:]
        out = [(title, single, columns)] if single else []
        if len(single) < len(rows):
            out.append((f"{title}, batched (throughput over the batch, latency per sequence)", rows,
                        self.BATCH_COLUMNS))
        return out


class ImageSuite:
    """images: methods x temperatures, grids and speed-quality plots (specgen/eval/image_bench.py)."""

    config_type = ImageBenchConfig
    row_key = "method"
    COLUMNS = ["method", "temperature", "dtype", "lossless", "images_per_s", "speedup_vs_ar", "vs_ar_b1", "tau",
               "d_bar", "nfe", "tpf", "drafter_share", "efficiency", "exact_match_vs_ar", "exact_match_vs_own_ar",
               "nll", "clf_fid", "class_accuracy"]

    @staticmethod
    def plan(cfg, resolved=None) -> ImageBenchConfig:  # its inputs (classes, seeds) are the config's
        check_out_dir(cfg)
        return checked_rows(cfg)

    def resolved(self, cfg) -> dict | None:
        """t2i: the captions file's digest, so a resume over an edited file is refused (as the text suite's prompts);
        a file that is not there is left to the run's own check of it."""
        caps = Path(cfg.captions) if cfg.captions else None
        return {"captions": file_digest(caps)} if caps is not None and caps.is_file() else None

    def grids(self, cfg) -> list[Grid]:
        return list(image_bench.grids(cfg).values())

    def measure(self, cfg, sink, shard: Shard, on_item, machine, quiet: bool) -> None:
        check_classifier(cfg)
        im = load_image_model(cfg.model, cfg.drafter, cfg.device, dtype=cfg.dtype, graphs=cfg.graphs,
                              need_drafter=any(m != "ar" for m in cfg.methods))
        measure_images(im, cfg, sink, shard, on_item, machine)

    def finish(self, cfg, sink, quiet: bool, shown=every) -> list[dict]:
        rows, pixels = image_rows_of(cfg, sink)
        rows = [r for r in rows if shown(r)]  # a report's grids and plots are of the rows it shows
        kept = {(r["method"], r["temperature"]) for r in rows}
        pixels = {k: px for k, px in pixels.items() if k in kept}
        files = write_outputs(rows, pixels, Path(cfg.out_dir)) if cfg.out_dir else []
        if files and not quiet:
            _output.err.print("wrote " + ", ".join(str(f) for f in files), markup=False)
        return [{**r, "model": cfg.model} for r in rows]

    def tables(self, rows: list[dict], cfg, sink) -> list[Table]:
        # each lossy row says so in its own cell, and the title names the lossy rows of this table (none: nothing)
        lossy = list(dict.fromkeys(row_name(r, "method") for r in rows if not r["lossless"]))  # ROW@bB: ROW
        note = f"; LOSSY rows: {', '.join(lossy)}" if lossy else ""
        shown = [{**r, "lossless": "yes" if r["lossless"] else "LOSSY"} for r in rows]
        return [(f"images: {cfg.model}, {cfg.num} images per row, cfg {cfg.cfg_scale} ({machine_of(sink)}){note}; "
                 "clf_fid/class_accuracy use the offline tiny classifier, not Inception", shown, self.COLUMNS)]


class MeshSuite:
    """meshes: XSpecMesh's table-3 rows and threshold sweeps (specgen/eval/mesh_bench.py)."""

    config_type = MeshBenchConfig
    row_key = "row"  # `method` is ar or xspecmesh there
    COLUMNS = ["row", "dtype", "rule", "cd", "hd", "valid_rate", "scr", "step_latency_ms", "tokens_per_s",
               "meshes_per_s", "speedup_vs_ar", "vs_ar_b1", "speedup_scr_lat", "mean_tokens"]

    def plan(self, cfg, resolved=None) -> MeshBenchConfig:  # its inputs (the procedural test split): the config's
        variants(cfg)  # bad rows or options: one line before anything is written
        mesh_bench.check_run(cfg)  # before the run folder opens
        return cfg

    def resolved(self, cfg) -> None:
        return None

    def grids(self, cfg) -> list[Grid]:
        return [mesh_bench.grid(cfg, variants(cfg))]

    def measure(self, cfg, sink, shard: Shard, on_item, machine, quiet: bool) -> None:
        measure_meshes(cfg, sink, shard, on_item, machine)

    def finish(self, cfg, sink, quiet: bool, shown=every) -> list[dict]:
        return [r for r in mesh_rows_of(cfg, sink) if shown(r)]

    def tables(self, rows: list[dict], cfg, sink) -> list[Table]:
        other = rows[0]["cd_other_mesh"]  # None with one test mesh: there is no other to compare with
        return [(f"meshes: {cfg.model}, {cfg.limit} test point clouds from {cfg.offset}, T {cfg.temperature} top-k "
                 f"{cfg.top_k} top-p {cfg.top_p}, D {cfg.num_heads} ({machine_of(sink)}); reference CD: a box "
                 f"{rows[0]['cd_box']}, another test mesh {'- (one test mesh)' if other is None else other}", rows,
                 self.COLUMNS)]


SUITES: dict[str, Suite] = {"humaneval": TextSuite(), "text": TextSuite(), "images": ImageSuite(),
                            "meshes": MeshSuite()}


def run(name: str, path: Path | None, overrides: list[str], explicit: dict, spelled: dict[str, str],
        run_dir: Path | None, shard: str | None, fmt, out: Path | None, append: bool, quiet: bool) -> None:
    """Measure this process's items of the run (all of them unless sharded), then print the merged rows.
    `spelled`: config key -> the command-line option that set it (a resume's refusal names what the user gave)."""
    suite = SUITES[name]
    cfg = load_config(suite.config_type, path, overrides, **explicit)
    # recorded as picked: a report and a resume read the same rows
    cfg = picked_rows(name, cfg, explicit, read_recipe(path) if path is not None else {})
    check_mode(cfg.graphs, devices.device_name(cfg.device))  # refused before any model loads
    this, launcher = shard_of(shard, run_dir)
    _output.check_rows_path(out, append)
    given = asdict(cfg)  # what a run folder records: every rank the same
    cfg.device = process_device(cfg.device)
    p = suite.plan(cfg)
    # without --run-dir the records go to a temporary folder, removed when the run ends
    scratch = tempfile.TemporaryDirectory(prefix="specgen-bench-") if run_dir is None else None
    sink = RunDir.open(run_dir or Path(scratch.name), cfg.suite, given, suite.resolved(p), spelled,
                       defaults_of(suite.config_type))
    grids = suite.grids(p)
    records = sink.records(grids)
    steps = sum(len(left) for g in grids for left in g.left(records, this))  # 0: nothing loads, unless
    if steps or this.label not in sink.machines():  # the shard's machine file is gone or torn: written again
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        sink.start_shard(this)  # the shard's lock (one writer per shard) and a torn last record cut off
        try:
            with _output.progress(f"benchmark {cfg.suite}", steps, quiet or fmt == Format.json) as advance:
                # the machine label (it changes what a verify costs) is read once the run has set its threads
                suite.measure(p, sink, this, advance, lambda: label(machine_facts(cfg.device), cfg.device), quiet)
        except BaseException as e:  # a refusal as models load (a prompt past the context, no such model): no folder
            if this.count == 1:
                sink.discard()
            if isinstance(e, UnregisteredRowModel) and path is not None:  # how the recipe's header makes it
                raise e.advised(recipe_advice(e.name, path)) from None
            raise
    rows = merged_rows(sink, lambda s: suite.finish(p, s, quiet), this, launcher, quiet)
    if rows is not None:
        show(suite, rows, p, sink, fmt, out, append)


def report(args: list[str], methods: list[str] | None, fmt, out: Path | None, append: bool, quiet: bool) -> None:
    """`specgen benchmark report RUN_DIR`: the table of a finished run folder (also one copied from a cluster), all
    its rows or those `methods` names (at every batch size); their numbers are the run's either way."""
    if not args:
        raise UsageError("usage: specgen benchmark report RUN_DIR [out_dir=DIR] [--methods ROWS] [--format json] "
                         "[--out FILE [--append]]")
    run_dir = RunDir.existing(Path(args[0]))
    if run_dir.suite not in SUITES:
        raise UsageError(f"{run_dir.path} holds a {run_dir.suite} run; report reads {', '.join(SUITES)} runs")
    # the run is shown as measured: only where its files go may change (the recorded folder may be another machine's)
    overrides = args[1:]
    wrong = next((o for o in overrides if not o.startswith("out_dir=")), None)
    if wrong is not None:
        raise UsageError(f"{wrong!r}: `benchmark report` prints the run as measured; its one override is out_dir=DIR "
                         "(an images run's grids and plots; out_dir= for none)")
    if overrides and "out_dir" not in run_dir.config:
        raise UsageError(f"{overrides[0]!r}: a {run_dir.suite} run writes no files: out_dir=DIR is for an images "
                         "run's grids and plots")
    _output.check_rows_path(out, append)
    suite = SUITES[run_dir.suite]
    recorded = {k: v for k, v in run_dir.config.items() if k != "out_dir" or not overrides}  # the override wins
    # checked like a recipe (a tampered run.json is one line), but the device and threads were the node's (a GPU,
    # more CPUs than here): checked there, loaded as this machine's, then restored (a report runs no model)
    node = {k: recorded[k] for k in ("device", "threads") if k in recorded}
    cfg = load_config(suite.config_type, None, overrides, **{**recorded, "device": "cpu", "threads": 0})
    p = suite.plan(replace(cfg, **node), run_dir.resolved)
    known = list(dict.fromkeys(r for g in suite.grids(p) for r in g.rows))
    missing = next((m for m in methods or () if m not in known), None)
    if missing is not None:  # before `finish`, which may write files (the images suite's grids and plots)
        raise UsageError(f"--methods: the run has no row {missing!r}; its rows: {', '.join(known)}")
    shown = every if methods is None else lambda r: row_name(r, suite.row_key) in methods
    rows = suite.finish(p, run_dir, quiet, shown)
    show(suite, rows, p, run_dir, fmt, out, append)


def row_name(row: dict, key: str) -> str:
    """A row's name as `--methods` gives it: a batched row's (`ROW@bB` in images and meshes) is its batch-1 row's."""
    batch = row.get("batch_size") or 1
    return row[key] if batch == 1 else row[key].removesuffix(f"@b{batch}")


def show(suite: Suite, rows: list[dict], p, sink, fmt, out: Path | None, append: bool) -> None:
    """The rows, each with its machine, as JSONL (`--out`), then JSON or the suite's tables on stdout; last, on stderr,
    the one line saying that timed items made captures (their times hold them), where they did."""
    machine = machine_of(sink)
    for r in rows:
        r["machine"] = machine
    _output.write_rows(out, rows, append)
    if fmt == Format.json:
        _output.emit_json(rows)
    else:
        for title, shown, columns in suite.tables(rows, p, sink):
            _output.table(title, shown, columns, _output.out)
    if note := timed_note(sink.machines()):
        _output.err.print(note, markup=False, soft_wrap=True)


def print_dry_run(config: Path | None, overrides: list[str] | None, explicit: dict, fmt, run_dir: Path | None = None,
                  shard: str | None = None, out: Path | None = None, append: bool = False,
                  spelled: dict[str, str] | None = None) -> None:
    """`--dry-run`: the recipe's checks (with the command line's options; without a recipe, those alone; an earlier
    run in `run_dir` compared with them as the run compares it) and those of where the run writes (`place_checks`)
    as a table (or JSON); exit 1 when one fails."""
    rows = check_recipe(config, overrides, explicit, run_dir, spelled)
    places = place_checks(run_dir, shard, out, append)
    if not any(r["check"] == "suite" for r in rows):  # another command's recipe (row `recipe`): no benchmark runs it
        places = [row(r["check"], False, f"--{r['check']} is a benchmark suite's option; this recipe runs with its "
                      "own command (row `recipe`), which has none") for r in places]
    rows += places
    if fmt == Format.json:
        _output.emit_json(rows)
    else:
        _output.table(f"dry run of {config or 'the command line'}", [{**r, "ok": "ok" if r["ok"] else "FAIL"} for r in rows],
                      ["check", "ok", "detail"], _output.out)
    if not all(r["ok"] for r in rows):
        raise typer.Exit(1)


def place_checks(run_dir: Path | None, shard: str | None, out: Path | None, append: bool) -> list[dict]:
    """--shard, --run-dir and --out (--append) checked as the run checks them before its work, one row each given: a
    job's own line dry-run first (`--run-dir runs/x --shard $ID/8`) must not pass what the job then refuses. Nothing
    is written (an earlier run's config is compared by `check_recipe`: its `resume` row)."""
    def run_dir_detail() -> str:
        RunDir.check_place(run_dir)
        if (run_dir / "run.json").exists():
            return f"{run_dir}: an earlier {RunDir.existing(run_dir).suite} run"
        return f"{run_dir}: a new run"

    def shard_detail() -> str:
        this, _ = shard_of(shard, run_dir)
        return f"{this.index}/{this.count}"

    def out_detail() -> str:
        _output.check_rows_path(out, append)
        return f"{out}: rows {'appended' if append and out.is_file() else 'in a new file'}"

    checks = []
    for name, given, detail in (("shard", shard is not None, shard_detail), ("run-dir", run_dir is not None,
                                run_dir_detail), ("out", out is not None or append, out_detail)):
        if given:
            try:
                checks.append(row(name, True, detail()))
            except UsageError as e:
                checks.append(row(name, False, str(e).splitlines()[0]))
    return checks


def shard_of(shard: str | None, run_dir: Path | None) -> tuple[Shard, int | None]:
    """(this process's shard, the pid of the launcher that started it, its parent now: `wait_for_ranks` looks for
    it; None without a launcher); several shards need a folder to meet in."""
    launched = launcher_shard()
    if shard is not None and launched is not None:
        raise UsageError("--shard and a launcher's ranks (RANK/WORLD_SIZE) both split the items; use one of them")
    if launched is not None and not {"MASTER_ADDR", "MASTER_PORT"} <= os.environ.keys():  # the barrier meets there
        raise UsageError(f"RANK/WORLD_SIZE are set ({launched.index}/{launched.count}) without MASTER_ADDR/"
                         "MASTER_PORT, where the ranks meet when done: start them with torchrun or accelerate "
                         "launch, or unset RANK/WORLD_SIZE and give --shard I/N")
    chosen = parse_shard(shard) if shard is not None else launched or Shard()
    if chosen.count > 1 and run_dir is None:
        raise UsageError(f"shard {chosen.index}/{chosen.count}: a sharded run needs --run-dir DIR, the folder "
                         "where the shards' records meet (report merges them)")
    return chosen, os.getppid() if launched is not None else None


def process_device(device: str) -> str:
    """This process's device: `auto` resolved; under a launcher a bare `cuda` is this rank's GPU (LOCAL_RANK).
    Resolved after the run folder recorded the config as given, so every rank records the same config."""
    name = devices.device_name(device)
    local = os.environ.get("LOCAL_RANK")
    if name == "cuda" and local is not None and torch.cuda.device_count() > 1:
        return f"cuda:{int(local) % torch.cuda.device_count()}"
    return name


def merged_rows(sink, rows_of, shard: Shard, launcher: int | None, quiet: bool) -> list[dict] | None:
    """The finished run's rows; None on a launcher rank other than 0, or when other shards are not done yet
    (said in one line: their records are merged by the last shard to finish or by `benchmark report`). `launcher`:
    the pid of the launcher that started this rank (`shard_of`), whose ranks meet first (`wait_for_ranks`)."""
    if launcher is not None:
        wait_for_ranks(launcher, sink.path)
        if shard.index != 0:
            return None
    try:
        rows = rows_of(sink)
    except RunNotFinished as e:
        if not quiet:
            _output.err.print(f"shard {shard.index}/{shard.count} is done; {e}. "
                              f"`specgen benchmark report {sink.path}` prints the table once every shard is done.",
                              markup=False, soft_wrap=True)
        return None
    who = sink.claim_table(shard) if shard.count > 1 and launcher is None else None  # array tasks: the first prints
    if who is not None:
        if not quiet:
            _output.err.print(f"shard {shard.index}/{shard.count} is done; the table was printed by {who} "
                              f"(`specgen benchmark report {sink.path}` prints it again)", markup=False, soft_wrap=True)
        return None
    return rows


def machine_of(sink) -> str:
    """The machine label of the shards that measured a run (one label when they agree), else this machine's: where
    and how a benchmark ran, printed with every table and stored in every row (`specgen env`'s facts)."""
    labels = sorted({info.get("machine") or "?" for info in sink.machines().values()})
    return "; ".join(labels) or label(machine_facts())


def roofline_note(sink) -> str:
    """The AR roofline of the run's first shard: its copy bandwidth / the bytes one AR forward streams."""
    info = next(iter(sink.machines().values()), {})
    bandwidth, ar = info.get("bandwidth_gbs"), (info.get("streamed_bytes") or {}).get("ar")
    return (f"; AR roofline {bandwidth * 1e9 / ar:.0f} tokens/s = {bandwidth:.1f} GB/s copy bandwidth / "
            f"{ar / 1e6:.1f} MB of weights per step") if bandwidth and ar else ""
