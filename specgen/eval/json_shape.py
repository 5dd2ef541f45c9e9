"""Whether a value read back from JSON has the shape of a type a summary builds from it (`fault`)."""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, Callable

# the Python types json.loads makes for each scalar type: an integer is a float too; true is no int (though 1 == True)
SCALARS: dict[Any, tuple[type, ...]] = {int: (int,), float: (int, float), str: (str,), bool: (bool,),
                                        type(None): (type(None),)}
# what a JSON value is, as a message names it
KINDS = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number", bool: "a boolean",
         type(None): "null"}
# a value's bound, as a record's dataclass writes it: `Annotated[float, "> 0"]` (a time a summary divides by)
BOUNDS: dict[str, Callable[[Any], bool]] = {"> 0": lambda v: v > 0, ">= 0": lambda v: v >= 0,
                                             "sum > 0": lambda v: sum(v.values()) > 0}


def fault(value: Any, hint: Any, where: str) -> str | None:
    """Why JSON `value` cannot be read as `hint`, naming the place in it from `where` (e.g. runs.ar.tokens[3]), or
    None. `hint`: a dataclass (an object of its fields), list[X], tuple[X, Y] (a list of one of each), dict[str, X],
    X | None, int, float, str or bool."""
    why = inside(value, hint)
    return None if why is None else where + why


def inside(value: Any, hint: Any) -> str | None:
    """`fault`'s message without the place of `value`: the rest of the path first (`[3] is a string, not int`); built
    only on a fault, since a record's lists are long (an image's tokens and features)."""
    check = fields_fault if dataclasses.is_dataclass(hint) else CHECKS[typing.get_origin(hint) or hint]
    return check(value, hint)


def wrong(value: Any, hint: Any) -> str:
    return f" is {KINDS.get(type(value), type(value).__name__)}, not {name(hint)}"


def name(hint: Any) -> str:
    """A type as its annotation spells it (list[Run], not list[specgen.eval.text_rows.Run])."""
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " | ".join(map(name, typing.get_args(hint)))
    if typing.get_origin(hint) is typing.Annotated:  # its base type: a bound is named where it is not met
        return name(typing.get_args(hint)[0])
    args = typing.get_args(hint)
    return f"{typing.get_origin(hint).__name__}[{', '.join(map(name, args))}]" if args else hint.__name__


def scalar(value: Any, hint: type) -> str | None:
    return None if type(value) in SCALARS[hint] else wrong(value, hint)


def sequence(value: Any, hint: Any) -> str | None:
    if type(value) is not list:
        return wrong(value, hint)
    (item,) = typing.get_args(hint)
    ok = SCALARS.get(item)
    if ok is not None:  # each element's type alone, no call per element
        bad = next((i for i, v in enumerate(value) if type(v) not in ok), None)
        return None if bad is None else f"[{bad}]{wrong(value[bad], item)}"
    return first(f"[{i}]{why}" for i, v in enumerate(value) if (why := inside(v, item)) is not None)


def mapping(value: Any, hint: Any) -> str | None:
    if type(value) is not dict:  # (JSON's keys are strings)
        return wrong(value, hint)
    _, item = typing.get_args(hint)
    return first(f".{k}{why}" for k, v in value.items() if (why := inside(v, item)) is not None)


def fixed(value: Any, hint: Any) -> str | None:
    """tuple[X, Y, ...]: a list of one value of each type, in order."""
    each = typing.get_args(hint)
    if type(value) is not list:
        return wrong(value, hint)
    if len(value) != len(each):
        return f" has {len(value)} values, not the {len(each)} of {name(hint)}"
    return first(f"[{i}]{why}" for i, (v, h) in enumerate(zip(value, each)) if (why := inside(v, h)) is not None)


def bounded(value: Any, hint: Any) -> str | None:
    """Annotated[X, bound, ...]: an X within each bound (BOUNDS)."""
    base, *bounds = typing.get_args(hint)
    why = inside(value, base)
    if why is not None:
        return why
    out = next((b for b in bounds if not BOUNDS[b](value)), None)
    return None if out is None else f" is {value!r}, not {out}"


def either(value: Any, hint: Any) -> str | None:
    return None if any(inside(value, h) is None for h in typing.get_args(hint)) else wrong(value, hint)


def fields_fault(value: Any, cls: type) -> str | None:
    """An object with every field of dataclass `cls` that has no default, and no other key."""
    if type(value) is not dict:
        return wrong(value, cls)
    hints, required = shape(cls)
    other = next((k for k in value if k not in hints), None)
    if other is not None:
        return f" has {other!r}, no field of {cls.__name__}"
    gone = next((k for k in required if k not in value), None)
    if gone is not None:
        return f" lacks {gone!r}"
    return first(f".{k}{why}" for k, v in value.items() if (why := inside(v, hints[k])) is not None)


def keys_fault(doc: dict, hints: dict[str, Any]) -> str | None:
    """Each key of `hints` present in object `doc` and of its type (its other keys are not read, so not checked)."""
    gone = next((k for k in hints if k not in doc), None)
    if gone is not None:
        return f"it lacks {gone!r}"
    return first(fault(doc[k], hint, k) for k, hint in hints.items())


@cache
def shape(cls: type) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(field -> type, the fields without a default) of a dataclass; its annotations resolved in its module."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = dataclasses.fields(cls)
    required = tuple(f.name for f in fields if (f.default, f.default_factory) == (dataclasses.MISSING,) * 2)
    return {f.name: hints[f.name] for f in fields}, required


def first(faults) -> str | None:
    return next(filter(None, faults), None)


CHECKS: dict[Any, Callable[[Any, Any], str | None]] = {
    **dict.fromkeys(SCALARS, scalar), list: sequence, tuple: fixed, dict: mapping, types.UnionType: either,
    typing.Union: either, typing.Annotated: bounded}
