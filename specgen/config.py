"""Typed configs: YAML recipes plus `key=value` overrides merged into frozen dataclasses (OmegaConf)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml

from specgen.errors import UsageError

T = TypeVar("T")
DEFAULTS: dict[type, Any] = {}  # each class's parsed defaults: nothing writes them (merges copy, to_object reads)
#: keys whose relative path in a recipe file is read against the file's folder, so the recipe runs from any working
#: directory (ship_dir: the package folder a tiny recipe rebuilds its built-in into); a command line's paths, as
#: anywhere, against the working directory
RECIPE_RELATIVE = ("ship_dir",)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                **explicit: Any) -> T:
    """Merge dataclass defaults <- YAML file <- `key=value` overrides <- explicit non-None values; unknown keys, wrong
    types and out-of-range values (`specgen.config_checks`) are one-line usage errors naming their source."""
    from omegaconf import OmegaConf  # deferred: start-up (the CLI's help imports this module)

    from specgen.config_checks import check_config  # deferred: start-up (it imports torch)

    if cls not in DEFAULTS:  # parsed once a process
        DEFAULTS[cls] = guarded("defaults", lambda: OmegaConf.structured(cls))
    merged = DEFAULTS[cls]
    if path is not None:
        merged = guarded(f"config file {path}", lambda: OmegaConf.merge(merged, read_recipe(Path(path))))
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
    if not p.is_file():
        raise UsageError(f"config file not found: {p}")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"config file {p} is not UTF-8 text (a YAML recipe is expected)") from None
    except OSError as e:
        raise UsageError(f"cannot read config file {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise UsageError(f"config file {p} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if doc is not None and not isinstance(doc, dict):  # (an empty file is an empty recipe)
        raise UsageError(f"config file {p} must be a mapping of recipe keys, not a {type(doc).__name__}")
    doc = doc or {}
    # lexically (normpath), so a recipe run from the checkout's root records the path it always did
    return {**doc, **{k: os.path.normpath(p.parent / doc[k]) for k in RECIPE_RELATIVE
                      if isinstance(doc.get(k), str) and doc[k] and not os.path.isabs(doc[k])}}


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
        raise UsageError(f"bad config: {source}: {str(e).splitlines()[0]}") from None
    except (TypeError, ValueError, AttributeError) as e:  # e.g. a list where a mapping is expected
        detail = "a list where a mapping is expected, or the reverse" if "container types" in str(e) else str(e)
        raise UsageError(f"bad config: {source}: {detail.splitlines()[0] if detail else type(e).__name__}") from None
