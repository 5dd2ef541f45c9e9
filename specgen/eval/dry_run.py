"""Dry run of a recipe: every check that needs no GPU and no weights, one `{check, ok, detail}` row each."""

from __future__ import annotations

import dataclasses
import importlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from specgen import registry
from specgen.builders import BUILDERS
from specgen.builtins import BUILTINS
from specgen.checkpoints import meta_module
from specgen.config import load_config, read_recipe
from specgen.config_checks import AUTO_DEVICE, TooManyThreads
from specgen.data.prompts import PromptSourceError
from specgen.devices import check_device
from specgen.errors import SpecgenError, UsageError
from specgen.eval import image_bench, mesh_bench, text_bench
from specgen.eval.image_bench import check_out_dir, checked_rows, method_of, options_of
from specgen.eval.mesh_bench import check_run, variants
from specgen.eval.run_dir import RunDir, defaults_of
from specgen.eval.sweeps import Entries, entry_tables
from specgen.eval.text_bench import check_prompts_fit, decoded_model, is_peer, plan, prompts_said, stops_said
from specgen.memory import size
from specgen.methods import get_method
from specgen.precision import split_name


@dataclass(frozen=True)
class Kind:
    """A recipe kind: its config dataclass (module, name), the command that reads it, the keys naming the registry
    entries it reads (a suite's plan names its own), the keys naming files, the key whose entry records a VQ."""

    module: str
    config: str
    command: str
    entries: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    vq_of: str = ""


BENCH = "specgen benchmark"
TRAINS_ON_VQ = ("vq", "warm_start")
KINDS: dict[str, Kind] = {
    "humaneval": Kind("specgen.eval.text_bench", "TextBenchConfig", BENCH),
    "text": Kind("specgen.eval.text_bench", "TextBenchConfig", BENCH),
    "images": Kind("specgen.eval.image_bench", "ImageBenchConfig", BENCH, files=("captions",), vq_of="model"),
    "meshes": Kind("specgen.eval.mesh_bench", "MeshBenchConfig", BENCH),
    "collect-trajectories": Kind("specgen.text.trajectories", "CollectConfig", "specgen collect-trajectories",
                                 ("model", "init_adapter"), ("prompts",)),
    "distill": Kind("specgen.train.distill", "DistillConfig", "specgen distill", ("model", "init_adapter"),
                    ("trajectories",)),
    "eagle": Kind("specgen.train.eagle", "EagleTrainConfig", "specgen train-heads --kind eagle", ("target", "init"),
                  ("captions",), vq_of="target"),
    "xspecmesh": Kind("specgen.train.heads", "HeadsTrainConfig", "specgen train-heads --kind xspecmesh",
                      ("target", "init")),
    "upsampler": Kind("specgen.train.upsampler", "UpsamplerTrainConfig", "specgen train-upsampler", TRAINS_ON_VQ),
    "mesh-gpt": Kind("specgen.train.mesh", "MeshTrainConfig", "python -m specgen.train.mesh"),
    "image-gpt-lowres": Kind("specgen.train.image_gpt_lowres", "LowresGPTTrainConfig",
                             "python -m specgen.train.image_gpt_lowres", TRAINS_ON_VQ),
    "image-gpt": Kind("specgen.train.image_gpt", "ImageGPTTrainConfig", "python -m specgen.train.image_gpt",
                      TRAINS_ON_VQ),
    "vq": Kind("specgen.train.vq", "VQTrainConfig", "python -m specgen.train.vq"),
    "classifier": Kind("specgen.train.classifier", "ClassifierTrainConfig", "python -m specgen.train.classifier"),
}
BUILTIN_PROMPTS = "stdlib"  # collect-trajectories' built-in prompt set: no file

#: header-comment marker -> kind: each command as `specgen CMD`, `-m cli.main CMD` or `-m MODULE` spell it; a
#: marker ends in a space (`specgen.train.image_gpt ` is not `specgen.train.image_gpt_lowres`)
MARKERS = [(f"{spelling} ", kind) for kind, k in KINDS.items() if k.command != BENCH
           for spelling in dict.fromkeys((k.command.removeprefix("python -m "),
                                          k.command.replace("specgen ", "cli.main ", 1)))]

IMPORT_RE = re.compile(r"specgen registry import\s[^`\n]*?--name[ =](?P<name>[A-Za-z0-9][A-Za-z0-9._+-]*)[^`\n]*")


def row(check: str, ok: bool, detail: str) -> dict:
    return {"check": check, "ok": bool(ok), "detail": detail}


def config_class(kind: str) -> type:
    return getattr(importlib.import_module(KINDS[kind].module), KINDS[kind].config)


def header(path: Path) -> str:
    """The recipe's comment lines (where recipes name their command, checkpoints and import commands)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line.lstrip("# ").rstrip() for line in lines if line.lstrip().startswith("#"))


def recipe_kind(doc: dict, comments: str, overrides: list[str], file_name: str = "") -> str:
    """Which config a recipe is for: `suite` (benchmark), the command its header runs it with (a header line naming
    the recipe's own file first, then the first line naming a command), or the config its keys fit best."""
    suite = next((o.partition("=")[2] for o in overrides if o.partition("=")[0].strip() == "suite"), None)
    suite = suite or doc.get("suite")
    if suite is not None:
        if suite not in SUITE_PLANS:
            raise UsageError(f"unknown suite {suite!r}; suites: {', '.join(SUITE_PLANS)}")
        return str(suite)
    head = comments.split("\n")
    own = [line for line in head if file_name and file_name in line]
    for line in own + head[:12]:
        for marker, kind in MARKERS:
            if marker in line + " ":
                return kind
    keys, fits = set(doc), []
    for kind in (k for k in KINDS if k not in SUITE_PLANS):
        fields = {f.name for f in dataclasses.fields(config_class(kind))}
        fits.append((len(keys & fields) - len(keys - fields), kind))
    fits.sort(key=lambda f: -f[0])
    if not keys or (len(fits) > 1 and fits[0][0] == fits[1][0]):
        raise UsageError("cannot tell which command this recipe is for: give it a `suite` key (benchmark) or a "
                         "header comment naming the command (e.g. `# specgen distill --config ...`)")
    return fits[0][1]


def check_recipe(path: Path | None, overrides: list[str] | None = None, explicit: dict | None = None,
                 run_dir: Path | None = None, spelled: dict[str, str] | None = None) -> list[dict]:
    """One `{"check", "ok", "detail"}` row per check; a recipe that cannot be read or placed is a UsageError.
    `explicit`: the command line's options (config key -> value; `suite` a known suite), applied as the run would.
    No `path`: the command line alone, as a recipe of no keys (`explicit` then names its suite). `run_dir`: a
    benchmark's --run-dir, whose recorded run (if any) must be this config's (`spelled`: key -> the option that set
    it, as the run's refusal names it)."""
    path = None if path is None else Path(path)
    overrides, explicit = list(overrides or []), dict(explicit or {})
    raw = {} if path is None else read_recipe(path)  # UsageError: missing, not UTF-8, invalid YAML, not a mapping
    comments = "" if path is None else header(path)
    kind = explicit.get("suite") or recipe_kind(raw, comments, overrides, "" if path is None else path.name)
    cls = config_class(kind)
    suite = f", suite {kind}" if kind in SUITE_PLANS else ""
    name = "the command line" if path is None else path.name
    rows = [row("recipe", True, f"{name}: for `{KINDS[kind].command}` ({cls.__name__}{suite})"),
            *([row("suite", True, kind)] if suite else [])]
    threads: dict[str, int] = {}  # thread keys past this machine's CPUs -> the recipe's count, which its node runs
    cfg = load_checked(cls, path, overrides, raw, rows, explicit, threads)
    if cfg is None:
        return rows
    if kind in PICKS:
        try:
            cfg = picked_rows(kind, cfg, explicit, raw)
        except UsageError as e:  # an `options` entry no row reads (a typo)
            return rows + [row("rows", False, str(e).splitlines()[0])]
        if run_dir is not None and (run_dir / "run.json").is_file():
            rows.append(resume_row(run_dir, kind, replace(cfg, **threads), spelled))
    names = [(key, getattr(cfg, key, "")) for key in KINDS[kind].entries]
    if kind in SUITE_PLANS:
        try:
            cfg, method_rows, names = SUITE_PLANS[kind](cfg)
        except PromptSourceError as e:  # the rows are fine: their prompt set is not
            return rows + [row("prompts", False, str(e).splitlines()[0])]
        except (SpecgenError, TypeError, ValueError) as e:  # the rows' entries cannot be told: nothing more to check
            return rows + [row("rows", False, str(e).splitlines()[0])]
        rows += method_rows
    hints = import_hints(comments)  # in header order: the order of the rows of its other prerequisites below
    vq_of = KINDS[kind].vq_of  # an installed image target records the VQ entry it was imported with (its `--vq`)
    vq = str(((vq_of and registry.installed_meta(getattr(cfg, vq_of))) or {}).get("vq") or "")
    roles: dict[str, str] = {}  # registry name -> the role it is first read in (empty names left out)
    for role, name in [*names, ("vq", vq)]:
        if name:
            roles.setdefault(name, role)
    rows += [check_entry(role, name, hints, comments, path) for name, role in roles.items()]
    checked = {n.rpartition("/")[2] for n in roles}
    # the header's other prerequisites (e.g. the VQ an image GPT is imported with)
    rows += [check_entry("imported", name, hints, comments, path) for name in hints if name not in checked]
    for role, value in ((key, getattr(cfg, key)) for key in KINDS[kind].files):
        if value in ("", BUILTIN_PROMPTS):
            continue
        p = Path(value).expanduser()
        held = (f"folder, {sum(1 for _ in p.iterdir())} entries" if p.is_dir() else f"file, {size(p.stat().st_size)}"
                if p.exists() else "not found (it is made by an earlier step, or copied to the node)")
        rows.append(row(f"file {role}", p.exists(), f"{value}: {held}"))
    return rows


def load_checked(cls: type, path: Path, overrides: list[str], raw: dict, rows: list[dict], given: dict,
                 threads: dict[str, int]):
    """The config or None, its rows added to `rows`: keys and values through `load_config` (with the options
    `given`), the device and thread counts checked apart (a recipe for a GPU node names cuda and the node's CPUs,
    which this machine may lack: loaded at this machine's count, the node's put in `threads`, key -> count)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    explicit = {**given, "device": "cpu"} if "device" in fields else dict(given)
    node = []  # thread counts past this machine's CPUs: loaded at its count, checked where the recipe runs
    while True:  # each thread key at most once
        try:
            cfg = load_config(cls, path, overrides, **explicit)
            break
        except TooManyThreads as e:
            node.append(row(e.key, True, f"{e.threads}: more than this machine's {e.cpus} CPUs; checked when the "
                                         "recipe runs on its node"))
            explicit[e.key], threads[e.key] = e.cpus, e.threads
        except UsageError as e:
            rows.append(row("config", False, str(e)))
            return None
    rows.append(row("config", True, f"{len(raw)} keys valid for {cls.__name__}"
                    + (f", {len(overrides)} override(s)" if overrides else "")))
    rows += node
    if "device" not in fields:
        return cfg
    named = [o.partition("=")[2] for o in overrides if o.partition("=")[0].strip() == "device"]
    device = str(given.get("device") or (named[-1] if named else raw.get("device", fields["device"].default)))
    rows.append(device_row(device, cls.__name__))
    return dataclasses.replace(cfg, device=device)


def device_row(device: str, cls_name: str) -> dict:
    """The device key: a GPU this machine lacks (or has fewer of) is fine (the recipe is for a GPU node), a malformed
    name is not."""
    try:
        check_device(device, allow_auto=cls_name in AUTO_DEVICE)
    except UsageError as e:
        if not re.fullmatch(r"cuda(:\d+)?", device):
            return row("device", False, str(e))
        why = e if torch.cuda.is_available() else "no GPU on this machine"
        return row("device", True, f"{device}: {why}; checked when the recipe runs on the node")
    return row("device", True, device)


def checked(check: str, run: Callable[[], object], detail: str) -> dict:
    """The row of one of the run's own checks before a model loads: ok with `detail`, or its one-line refusal."""
    try:
        run()
    except SpecgenError as e:
        return row(check, False, str(e).splitlines()[0])
    return row(check, True, detail)


def resume_row(run_dir: Path, suite: str, cfg: Any, spelled: dict[str, str] | None) -> dict:
    """Would the run continue the run recorded in `run_dir`? `cfg`: the config as the run records it (picked rows,
    the node's device and threads), compared as `RunDir.open` compares it (the plan's inputs, such as an edited
    prompt file, are compared when the run opens the folder)."""
    return checked("resume", lambda: RunDir(run_dir, suite, dataclasses.asdict(cfg))
                   .check_continues(RunDir.existing(run_dir), spelled, defaults_of(type(cfg))),
                   f"{run_dir}: its run's config is this one; the run resumes it")


def text_plan(cfg: Any) -> tuple[Any, list[dict], list[tuple[str, str]]]:
    p = plan(cfg)
    names = [("model", cfg.model), *((f"{m} target", decoded_model(m, p.cfg)) for m in p.cfg.methods if not is_peer(m))]
    prompts = ", ".join(filter(None, [f"{len(p.items)} prompts", prompts_said(cfg)]))
    # the run's check of each prompt against the context reads the model's tokenizer: made here when it is installed
    # (a built-in is made on first use, by the run)
    fits = (checked("prompts", lambda: check_prompts_fit(p), f"{prompts}, each fits {cfg.model}'s context with "
                    f"max_new_tokens {p.cfg.max_new_tokens}") if registry.installed_meta(base_name(cfg.model)) else
            row("prompts", True, f"{prompts} (not installed here: the run checks their fit in {cfg.model}'s context)"))
    return p.cfg, [*(row(f"method {m}", True, "peer row (transformers / llama.cpp)" if is_peer(m) else
                         "lossless" if p.meta[m]["lossless"] else "LOSSY") for m in p.cfg.methods), fits,
                  row("stops", True, "every row, peer rows too, ends at the tokenizer's stop ids" + (
                      f" or at the token completing {stops_said(cfg)}" if cfg.stop else
                      " (no stop strings)"))], names


def base_name(name: str) -> str:
    """`name` without its precision suffix (`NAME+int8` is made from NAME on first use)."""
    try:
        return split_name(name)[0]
    except UsageError:
        return name


def image_plan(cfg: Any) -> tuple[Any, list[dict], list[tuple[str, str]]]:
    full = checked_rows(cfg)
    names = [("model", cfg.model), ("drafter", cfg.drafter), ("classifier", cfg.classifier if cfg.quality else "")]
    for m in (m for m in full.methods if method_of(m) == "mulo-sd"):
        o = options_of(full, m)
        names += [(f"{m} lowres", str(o.get("lowres") or "tiny-image-gpt-lowres")),
                  (f"{m} upsampler", str(o.get("upsampler") or ""))]
    return full, [*(row(f"method {m}", True, "lossless" if get_method(method_of(m)).lossless else "LOSSY")
                    for m in full.methods),
                  checked("out_dir", lambda: check_out_dir(cfg), cfg.out_dir or "none: no grids or plots")], names


def mesh_plan(cfg: Any) -> tuple[Any, list[dict], list[tuple[str, str]]]:
    vs = variants(cfg)
    heads = [(f"heads {r}", cfg.heads[r]) for r in [*cfg.rows, *cfg.merged_ar] if r != "ar" and r in cfg.heads]
    budget = f"max_new_tokens {cfg.max_new_tokens}" if cfg.max_new_tokens else "the context's budget"
    return cfg, [row("rows", True, f"{len(vs)} rows: {', '.join(v.label for v in vs)}"),
                 checked("meshes", lambda: check_run(cfg), f"{cfg.limit} test meshes from {cfg.offset}, {budget}")], \
        [("model", cfg.model), *heads]


@dataclass(frozen=True)
class Pick:
    """A suite's rows as `--methods` picks them: the config key naming them, the config as it picks them, what its
    `options` entries may name (`sweeps.Entries`), its options tables."""

    key: str
    pick: Callable[[Any], Any]
    entries: Callable[[Any], Entries]
    tables: Callable[[Any], dict[str, dict]]


TEXT_PICK = Pick("methods", text_bench.picked, text_bench.entries_of, entry_tables)
PICKS = {"humaneval": TEXT_PICK, "text": TEXT_PICK,
         "images": Pick("methods", image_bench.picked, image_bench.entries_of, entry_tables),
         "meshes": Pick("rows", mesh_bench.picked, mesh_bench.entries_of, mesh_bench.entry_tables)}


def picked_rows(suite: str, cfg: Any, explicit: dict, recipe: dict) -> Any:
    """A suite's config as the command line's `explicit` options give it. Every suite's one check of its `options`
    entries, as the run loads: one that no row reads, of the config's or of the recipe file's (`recipe`, its keys:
    `--methods` or `methods=[...]` may leave some of them out), is refused, naming the rows it could mean (a typo).
    `--methods` picks the rows, so a recipe's sweeps (and the images suite's ablations and entries, the meshes
    suite's `sweep_row` keys and `merged_ar`) of other methods or rows are left out with them."""
    p = PICKS[suite]
    rows, given = getattr(cfg, p.key), recipe.get(p.key)
    more = [str(r) for r in given if str(r) not in rows] if isinstance(given, list) else []
    read = p.entries(replace(cfg, **{p.key: [*rows, *more]}))
    replace(read, rows=tuple(rows)).check(p.tables(cfg))  # the rows listed: the run's
    return p.pick(cfg) if p.key in explicit else cfg


#: suite -> its run's own checks (the plan a benchmark builds): (the config with every row, a row per method, the
#: (role, registry name) of every entry it reads)
SUITE_PLANS = {"humaneval": text_plan, "text": text_plan, "images": image_plan, "meshes": mesh_plan}


RECIPE_PATH = re.compile(r"recipes/[\w./-]+?\.ya?ml")


def made_by(line: str, near: Path | None = None) -> str:
    """The command in its header that runs the recipe a header `line` names, as the entry's maker ("" if the line
    names none, none that says its command, or overrides after it: `name=...` makes another entry than the header's
    command). Recipes name each other from the checkout's root: an ancestor of `near` (the recipe read) or the
    working directory."""
    m = RECIPE_PATH.search(line)
    if m is None or re.search(r"\s\w+=\S", line[m.end():]):
        return ""
    roots = [Path.cwd(), *(near.resolve().parents if near is not None else ())]
    recipe = next((root / m[0] for root in roots if (root / m[0]).is_file()), None)
    if recipe is None:
        return ""
    commands, held = [], ""  # a command continued over lines (a trailing backslash) is quoted whole
    for ln in header(recipe).split("\n"):
        held += ln.strip()
        if held.endswith("\\"):
            held = held[:-1].rstrip() + " "
        else:
            commands.append(re.sub(r"\s{3,}\(.*$", "", held))  # without its remark: `cmd ...      (~75 min)`
            held = ""
    runs = re.compile(rf"(--config|-c) {re.escape(m[0])}( |$)")
    return next((c for c in commands if runs.search(c)), "")


def check_entry(role: str, name: str, hints: dict[str, str], comments: str = "", recipe: Path | None = None) -> dict:
    """Does `name` resolve in the registry, and do its weights fit its builder (headers only)? Nothing is
    materialised or loaded. `comments`: the header of `recipe`, the recipe read."""
    try:
        base = split_name(name)[0] if "+" in name else name
    except UsageError:
        base = name
    suffix = f" (its {name[len(base) + 1:]} copy is made from it on first use)" if base != name else ""
    check = f"entry {role}"
    folder = Path(base).expanduser()
    if registry.installed_meta(base) is not None:
        ok, detail = check_weights(registry.entry_at(folder) if (folder / registry.CONFIG).is_file()
                                   else registry.pick(registry.installed_entries(), base, "installed checkpoint"))
        return row(check, ok, f"{base}: {detail}{suffix}")
    bare = base.rpartition("/")[2]
    if bare in BUILTINS and base in (bare, f"{BUILTINS[bare].kind}/{bare}"):
        why = BUILTINS[bare].unavailable()
        return row(check, not why, f"{base}: built-in, but {why}" if why else
                   f"{base}: built-in, materialised on first use{suffix}")
    return row(check, False, f"{base}: not in the registry ({registry.checkpoints_dir()}); "
                             f"{advice(base, hints, comments, recipe)}")


def import_hints(comments: str) -> dict[str, str]:
    """Registry name -> the `specgen registry import ...` command a recipe's header gives for it (the first wins)."""
    hints: dict[str, str] = {}
    for m in IMPORT_RE.finditer(comments):
        hints.setdefault(m.group("name"), " ".join(m.group(0).split()))
    return hints


def advice(base: str, hints: dict[str, str], comments: str, recipe: Path | None) -> str:
    """How to register the missing entry `base`, from the header `comments` of `recipe`: the import command it
    gives, the command of the recipe that makes it, the line naming it, else the generic ways."""
    bare = base.rpartition("/")[2]
    how = hints.get(bare) or hints.get(base)
    said = next((line.strip() for line in comments.split("\n")
                 if re.search(rf"(^|[\s/(`]){re.escape(bare)}($|[\s)`,.;:])", line)), "")
    made = made_by(said, recipe)
    return (f"import it: `{how}`" if how else f"make it: `{made}`" if made else
            f"the recipe's header: {said}" if said else
            f"import it (`specgen registry import FILE --name {bare} ...`, docs/registry.md) or run the step that "
            "registers it (see the recipe's header)")


def recipe_advice(name: str, recipe: Path) -> str:
    """`advice` on registering the entry `name` (`NAME+int8`: NAME's) from the header of `recipe`: a run's refusal
    says it as its dry run's row does."""
    comments = header(recipe)
    return advice(split_name(name)[0], import_hints(comments), comments, recipe)


def check_weights(entry: registry.Entry) -> tuple[bool, str]:
    """(ok, detail) of an installed entry's model.safetensors against the module its builder makes (meta device)."""
    weights, meta = entry.path / registry.WEIGHTS, entry.meta
    if not weights.is_file():
        return False, f"installed at {entry.path} but has no {registry.WEIGHTS}"
    stored = registry.stored_shapes(entry)
    if stored is None:
        return False, f"{weights}: unreadable safetensors header"
    held, expected = f"installed, {size(weights.stat().st_size)}, {len(stored)} tensors", expected_shapes(meta)
    if expected is None:
        return True, f"{held} (builder {meta.get('builder')!r}: shapes not checked)"
    tied = set((meta.get("tied") or {}).keys())
    if "output.weight" in expected and "output.weight" not in stored and "tok_embeddings.weight" in stored:
        tied.add("output.weight")  # tied embeddings are stored once
    for key, shape in expected.items():
        if key in tied:
            continue
        if key not in stored:
            return False, f"{weights}: missing tensor {key} (builder {meta['builder']} expects shape {list(shape)})"
        if tuple(stored[key]) != tuple(shape):
            return False, (f"{weights}: tensor {key} has shape {list(stored[key])}, builder {meta['builder']} "
                           f"expects {list(shape)}")
    extra = sorted(set(stored) - set(expected))
    if extra:
        return False, f"{weights}: unexpected tensor {extra[0]} (not in builder {meta['builder']})"
    return True, f"{held} match builder {meta['builder']}"


def expected_shapes(meta: dict) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of the module `meta` describes, built on the meta device; None when not buildable."""
    builder, kwargs = meta.get("builder"), meta.get("kwargs")
    module = meta_module(builder, kwargs) if builder in BUILDERS and isinstance(kwargs, dict) else None
    return None if module is None else {k: tuple(v.shape) for k, v in module.state_dict().items()}
