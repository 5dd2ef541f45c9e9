"""Typed configs: YAML recipes plus `key=value` overrides merged into frozen dataclasses (OmegaConf)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from specgen.errors import UsageError

T = TypeVar("T")


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                **explicit: Any) -> T:
    """Merge dataclass defaults <- YAML file <- `key=value` overrides <- explicit non-None values.

    Unknown keys and values of the wrong type are usage errors (one line).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.structured(cls)
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise UsageError(f"config file not found: {p}")
            merged = OmegaConf.merge(merged, OmegaConf.load(p))
        for item in overrides or []:
            if "=" not in item:
                raise UsageError(f"override '{item}' is not key=value")
        if overrides:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides)))
        given = {k: v for k, v in explicit.items() if v is not None}
        if given:
            merged = OmegaConf.merge(merged, given)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        msg = str(e).splitlines()[0]
        raise UsageError(f"bad config: {msg}") from None


def to_dict(cfg: Any) -> dict:
    """A dataclass config as a plain dict (saved next to every output)."""
    return dataclasses.asdict(cfg)
