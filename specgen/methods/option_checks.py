"""Value checks of method options by name alone, for configs that hold options of several methods or rows
(`specgen.config_checks`: benchmark `method_options.NAME.*`, mesh `options` / `row_options`).

The checks themselves are the option dataclasses' fields (`specgen.methods.options`); `MethodSpec.check_options`
checks one method's options against its own class.
"""

from __future__ import annotations

from typing import Any

from specgen.methods.options import CHECKS, check_value


def check_option_values(method: str, options: dict[str, Any]) -> None:
    """Refuse the first option whose value fails the check its name has in the option classes (others pass)."""
    for name, value in options.items():
        check_value(name, value, CHECKS.get(name), method)
