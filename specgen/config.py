"""Typed configs: YAML recipes plus `key=value` overrides merged into frozen dataclasses (OmegaConf)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from specgen.errors import UsageError

if TYPE_CHECKING:
    from specgen.methods import MethodSpec

T = TypeVar("T")
DEFAULTS: dict[type, Any] = {}  # each class's parsed defaults: nothing writes them (merges copy, to_object reads)
#: keys whose relative path in a recipe file is read against the file's folder, so the recipe runs from any working
#: directory (ship_dir: the package folder a tiny recipe rebuilds its built-in into); a command line's paths, as
#: anywhere, against the working directory
RECIPE_RELATIVE = ("ship_dir",)
#: the command a recipe's header runs it with (`specgen CMD`, `-m cli.main CMD`, `python -m specgen.train.X`)
HEADER_COMMAND = re.compile(r"(?:specgen|-m cli\.main) ([a-z]+(?:-[a-z]+)*(?: --kind [a-z]+)?)|-m (specgen\.[\w.]+)")


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                spec: MethodSpec | None = None, **explicit: Any) -> T:
    """Merge dataclass defaults <- YAML file <- `key=value` overrides <- explicit non-None values; unknown keys
    (`check_keys`; `spec`: the method a `generate` decodes, whose options are no recipe keys), wrong types and
    out-of-range values (`specgen.config_checks`) are one-line usage errors naming their source."""
    from omegaconf import OmegaConf  # deferred: start-up (the CLI's help imports this module)

    from specgen.config_checks import check_config  # deferred: start-up (it imports torch)

    if cls not in DEFAULTS:  # parsed once a process
        DEFAULTS[cls] = guarded("defaults", lambda: OmegaConf.structured(cls))
    merged = DEFAULTS[cls]
    recipe = read_recipe(Path(path)) if path is not None else {}
    check_keys(cls, None if path is None else Path(path), recipe, overrides or [], spec)
    if path is not None:
        merged = guarded(f"config file {path}", lambda: OmegaConf.merge(merged, recipe))
    for item in overrides or []:
        merged = merge_override(merged, item)
    given = {k: v for k, v in explicit.items() if v is not None}
    for key, value in given.items():
        merged = guarded(f"option {key.replace('_', '-')}", lambda: OmegaConf.merge(merged, {key: value}))
    cfg = guarded("config", lambda: OmegaConf.to_object(merged))
    check_config(cfg)
    return cfg


def read_recipe(p: Path) -> dict:
    """A recipe file's mapping, `RECIPE_RELATIVE` paths joined to its folder; unreadable, non-UTF-8, malformed or
    non-mapping files are usage errors."""
    if p.is_dir():
        raise UsageError(f"config file {p} is a folder; name a recipe file in it (recipes/tiny/*.yaml)")
    if not p.is_file():
        raise UsageError(f"config file not found: {p}")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"config file {p} is not UTF-8 text (a YAML recipe is expected)") from None
    except OSError as e:
        raise UsageError(f"cannot read config file {p}: {e.strerror}") from None
    except RecursionError:  # collections nested thousands deep
        raise UsageError(f"config file {p} is not valid YAML: nested too deep") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise UsageError(f"config file {p} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if doc is not None and not isinstance(doc, dict):  # (an empty file is an empty recipe)
        raise UsageError(f"config file {p} must be a mapping of recipe keys, not a {type(doc).__name__}")
    doc = doc or {}
    if expanded_size(doc) > MAX_RECIPE_VALUES:
        raise UsageError(f"config file {p} expands to over {MAX_RECIPE_VALUES:,} values (YAML aliases of aliases); "
                         "spell the recipe's values out")
    # lexically (normpath), so a recipe run from the checkout's root records the path it always did
    return {**doc, **{k: os.path.normpath(p.parent / doc[k]) for k in RECIPE_RELATIVE
                      if isinstance(doc.get(k), str) and doc[k] and not os.path.isabs(doc[k])}}


MAX_RECIPE_VALUES = 100_000  # the shipped recipes hold at most 161; OmegaConf copies every alias out in full


def expanded_size(node: Any, sizes: dict[int, int] | None = None) -> int:
    """How many values `node` holds once YAML's aliases are copied out: an alias counts its whole target, whose count
    is computed once (memoised by identity). Aliases of aliases make a few lines hold 10^9 values, and an alias inside
    its own anchor is endless: OmegaConf would copy for hours, or recurse until Python stops it."""
    sizes = {} if sizes is None else sizes
    if id(node) not in sizes:
        sizes[id(node)] = MAX_RECIPE_VALUES + 1  # while it is counted: reached again through an alias, it is endless
        parts = [*node, *node.values()] if isinstance(node, dict) else node if isinstance(
            node, (list, tuple, set, frozenset)) else ()  # (!!omap and !!pairs load as tuples, !!set as a set)
        sizes[id(node)] = 1 + sum(expanded_size(v, sizes) for v in parts)
    return sizes[id(node)]


def check_keys(cls: type, path: Path | None, doc: dict, overrides: list[str], spec: MethodSpec | None) -> None:
    """Explain a key `cls` lacks, given in the recipe file `doc` or as an override, before OmegaConf's refusal (which
    names the nearest key, often another's): an option of `spec` given as a recipe key (`block_size=3` for
    `method_options.block_size=3`), a benchmark recipe (`suite`), or a recipe with several keys `cls` lacks whose
    header names its command. A lone other unknown key is a typo, which OmegaConf's refusal answers."""
    keys = {f.name for f in dataclasses.fields(cls)}
    given = [tuple(o.split("=", 1)) for o in overrides if "=" in o] + list(doc.items())
    wrong = next(((k, v) for k, v in given if spec is not None and k in spec.options and k not in keys), None)
    if wrong is not None:
        raise UsageError(f"{wrong[0]} is an option of {spec.name}, not a recipe key: give "
                         f"method_options.{wrong[0]}={wrong[1]}")
    unknown = [k for k in doc if k not in keys]
    if "suite" in unknown:
        raise UsageError(f"config file {path} is a benchmark recipe (suite: {doc['suite']}): run it with "
                         f"`specgen benchmark --config {path}`")
    command = header_command(path) if len(unknown) > 1 else ""
    if command:
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise UsageError(f"config file {path} is a recipe for `{command}` (its header runs it so): its keys "
                         f"{', '.join(unknown[:3])}{more} are not {cls.__name__}'s; run it with that command")


def header_command(path: Path) -> str:
    """The command of the first header comment line that runs a recipe (`--config`/`-c`), else ""."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        m = HEADER_COMMAND.search(line) if "--config " in line or " -c " in line else None
        if m:
            return f"specgen {m[1]}" if m[1] else f"python -m {m[2]}"
    return ""


def merge_override(merged: Any, item: str) -> Any:
    """Merge one `key=value`; `key=` (what the shell leaves of key="") is None or the empty string."""
    from omegaconf import OmegaConf  # deferred: start-up (the CLI's help imports this module)

    key, eq, value = item.partition("=")
    if not eq or not key.strip():
        raise UsageError(f"override {item!r} is not key=value")
    if value == "":
        for empty in (f"{key}=", f"{key}=''"):  # None (optional fields), then the empty string
            try:
                return OmegaConf.merge(merged, OmegaConf.from_dotlist([empty]))
            except Exception:  # noqa: BLE001 - try the next reading of an empty value
                continue
        raise UsageError(f"override {item!r} has no value: give {key} a value")
    return guarded(f"override {item!r}", lambda: OmegaConf.merge(merged, OmegaConf.from_dotlist([item])))


def guarded(source: str, merge: Any) -> Any:
    """Run one OmegaConf step; any failure is a one-line usage error naming `source`."""
    from omegaconf.errors import OmegaConfBaseException  # deferred: start-up (the CLI's help imports this module)

    try:
        return merge()
    except yaml.YAMLError as e:  # an override value YAML cannot read (control characters, stray quotes)
        raise UsageError(f"bad config: {source}: not a YAML value ({getattr(e, 'problem', None) or e})") from None
    except OmegaConfBaseException as e:
        detail = str(e).splitlines()[0]
        if "is not a ListConfig" in detail:  # a scalar for a list field: the form to give, not OmegaConf's node types
            detail = f"{e.full_key} takes a list, e.g. [{e.value}], not {e.value!r}"
        raise UsageError(f"bad config: {source}: {detail}") from None
    except (TypeError, ValueError, AttributeError) as e:  # e.g. a list where a mapping is expected
        detail = "a list where a mapping is expected, or the reverse" if "container types" in str(e) else str(e)
        raise UsageError(f"bad config: {source}: {detail.splitlines()[0] if detail else type(e).__name__}") from None
