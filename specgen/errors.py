"""Error hierarchy: usage errors (exit 2) versus runtime errors (exit 1), mapped by cli/."""

from __future__ import annotations

import difflib


class SpecgenError(Exception):
    """Base class: a one-line, user-facing message; `exit_code` tells the CLI how to exit."""

    exit_code = 1


class UsageError(SpecgenError):
    """The user asked for something invalid (bad option, unknown name, bad override)."""

    exit_code = 2


class RuntimeFailure(SpecgenError):
    """A valid request failed while running (corrupt file, failed conversion)."""


class UnknownNameError(UsageError):
    """An unknown method, checkpoint or suite; lists the closest known names."""

    def __init__(self, what: str, name: str, known: list[str]) -> None:
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.6)  # a typo, not any name sharing letters
        refs = {k.split("/", 1)[1] for k in known if "/" in k}  # a name known as kind/name too is listed so, once
        listed = sorted(k for k in known if k not in refs)
        hint = f"; did you mean {', '.join(near)}?" if near else f"; known: {', '.join(listed) or 'none'}"
        super().__init__(f"unknown {what} '{name}'{hint}")


class CheckpointError(RuntimeFailure):
    """A checkpoint is missing, corrupt, truncated, or incompatible with its partner."""


class IncompatibleError(UsageError):
    """Two artefacts that must belong together do not (drafter vs target, vocabulary sizes)."""


class MissingDependencyError(RuntimeFailure):
    """An optional package that this feature needs is not installed; the message says how."""


class ContextOverflowError(UsageError, ValueError):
    """A sequence (prompt + token budget) runs past the model's context; raised before the position is computed."""

    def __init__(self, position: int, context: int) -> None:
        super().__init__(f"this needs position {position}, beyond the model's context of {context} tokens: use shorter "
                         "prompts or a smaller --max-new-tokens")
