"""One variant syntax for the rows of every benchmark suite: `row@tag` rows, per-row `options`, `sweep` lists."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from specgen.errors import SpecgenError, UsageError
from specgen.methods import METHODS, get_method
from specgen.precision import check_row_precision

SCALARS = (str, int, float, bool)  # what a swept value may be (a list or mapping is no single setting)


def value_text(value: Any) -> str:
    """A value as a row name spells it: floats in %g (`0.001`, `1e-05`), booleans lower case."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class Sweep:
    """One option of one row set to each of `values`: one row per value, starting from the row's own options."""

    row: str  # the row (or `options` entry, or method) whose options every swept row copies
    option: str
    values: tuple
    fixed: tuple = ()  # (option, value) pairs every swept row also sets (how the older keys spelt their sweeps)
    label: str = ""  # row name with `{}` for the value; "" = `row@option={}`, or `row={}` when the row has a tag
    key: str = ""  # the recipe key it was written as, for messages; "" = `sweep.row.option`

    def name(self, value: Any) -> str:
        template = self.label or (f"{self.row}={{}}" if "@" in self.row else f"{self.row}@{self.option}={{}}")
        return template.format(value_text(value))

    def options(self, value: Any) -> dict:
        return {**dict(self.fixed), self.option: value}


@dataclass(frozen=True)
class SweptRow:
    """One row a sweep adds: its name, the row it copies, and the options it sets over that row's."""

    name: str
    base: str
    options: dict


def sweeps_of(spec: dict) -> list[Sweep]:
    """The `sweep` recipe key (a mapping: its config field's type) as Sweeps: `{row: {option: [values]}}` or flat
    `{"row.option": [values]}`. A key naming no option, a value that is not a non-empty list of scalars: one-line
    usage errors."""
    out = []
    for key, sub in spec.items():
        if isinstance(sub, dict):
            pairs = [(str(key), str(option), values) for option, values in sub.items()]
        else:
            row, dot, option = str(key).rpartition(".")  # option names have no dot; row names may
            if not (dot and row and option):
                raise UsageError(f"sweep.{key} names no option: write sweep.ROW.OPTION=[values], "
                                 f"e.g. sweep.{key}.OPTION=[1,2]")
            pairs = [(row, option, sub)]
        for row, option, values in pairs:
            out.append(Sweep(row, option, swept_values(f"sweep.{row}.{option}", values)))
    return out


@dataclass(frozen=True)
class Entries:
    """What the entries of a suite's options tables (`options` and its older name) may name: a row of the plan, its
    sweeps' rows and their bases (`names`), or a name every plan may hold whatever its rows (`families`: a method, read
    by its every row; a mesh `heads` row; a default entry). An entry naming none is a typo: no row would read it."""

    rows: tuple[str, ...]  # the plan's own rows, as a refusal lists them
    names: tuple[str, ...]
    families: tuple[str, ...]
    family: str  # a family in words, as a refusal names it: "a method", "a `heads` row"

    def reads(self, entry: str) -> bool:
        return entry in self.names or entry in self.families

    def check(self, tables: dict[str, dict]) -> None:
        """Refuse the first entry of `tables` (recipe key -> {entry: options}) that no row reads, naming the entry and
        the rows it could mean: its settings would be left unused, unsaid."""
        for key, table in tables.items():
            entry = next((str(e) for e in table or {} if not self.reads(e)), None)
            if entry is not None:
                close = difflib.get_close_matches(entry, list(dict.fromkeys([*self.names, *self.families])), 3)
                could = f"; did you mean {' or '.join(close)}?" if close else ""
                raise UsageError(f"{key}.{entry}: no row {entry!r} to set; an entry names a row "
                                 f"({', '.join(self.rows)}), {self.family} or a sweep's row{could}")

    def kept(self, table: dict) -> dict:
        """The entries of `table` some row reads (the images suite's `--methods` leaves out a recipe's entries of the
        rows it leaves out)."""
        return {k: v for k, v in table.items() if self.reads(k)}


def entries(rows: list[str], sweeps: list[Sweep], families: list[str], family: str) -> Entries:
    """The Entries of a plan of `rows` and `sweeps` (unchecked: the plan checks them, once their entries are)."""
    names = [*rows, *(name for s in sweeps for name in (s.row, *map(s.name, s.values)))]
    return Entries(tuple(dict.fromkeys(rows)), tuple(dict.fromkeys(names)), tuple(families), family)


def methods_on(modality: str) -> list[str]:
    return [name for name, spec in METHODS.items() if spec.runs_on(modality)]


def entry_tables(cfg) -> dict[str, dict]:
    """The options tables of a text or images config, as a refusal names them."""
    return {"options": cfg.options, "method_options": cfg.method_options}


def check_own_entry(row: str, method: str, tables: dict[str, dict], why: str = "") -> None:
    """Refuse a variant row (`METHOD@tag`, `METHOD:tag`) that no table of `tables` (recipe key -> {row: ...}) gives
    an entry of its own: it would decode as `method` under another name (a typo'd row, unsaid). `why`: what the
    refusal says first."""
    if row == method or any(row in table for table in tables.values()):
        return
    close = difflib.get_close_matches(row, [k for table in tables.values() for k in table if k != method], 1)
    raise UsageError(f"row {row}: {why}a variant row needs {' or '.join(f'{key}.{row}' for key in tables)} of its "
                     f"own (else it decodes as {method})" + (f"; did you mean {close[0]}?" if close else ""))


def check_rows(rows: list[str], dtype: str, dtypes: dict, device: str) -> None:
    """Each row given once (else decoded twice: two equal rows); `dtypes` names rows; each precision runs on device."""
    twice = next((r for r in rows if rows.count(r) > 1), None)
    if twice is not None:
        raise UsageError(f"row {twice!r} is given twice; rows: {', '.join(rows)}")
    for row, d in {"": dtype, **dtypes}.items():
        if row and row not in rows:
            raise UsageError(f"dtypes.{row}: no such row; rows: {', '.join(rows)}")
        check_row_precision(row, d, device)


def sweeps_on(spec: dict, picked: Callable[[str], bool]) -> dict:
    """The entries of a `sweep` mapping on the rows `picked` keeps (`--methods`); a flat key naming no row is kept,
    for `sweeps_of` to refuse."""
    def row(key: Any, sub: Any) -> str:
        return str(key) if isinstance(sub, dict) else str(key).rpartition(".")[0]

    return {k: v for k, v in spec.items() if not row(k, v) or picked(row(k, v))}


def dtypes_on(dtypes: dict, rows: Callable[[], list[str]], known: Callable[[str], bool]) -> dict:
    """The `dtypes` entries of the rows a picked plan decodes (`rows()`: `--methods` leaves a row out, and its entry
    with it); an entry no known row could have (a typo) stays for `check_rows` to refuse, and so does every entry
    when the plan cannot be built (the run's own checks refuse it in their words)."""
    try:
        kept = set(rows())
    except (SpecgenError, TypeError, ValueError):
        return dtypes
    return {r: d for r, d in dtypes.items() if r in kept or not known(r)}


def swept_values(where: str, values: Any) -> tuple:
    if not isinstance(values, (list, tuple)):
        raise UsageError(f"{where} must be a list of values, e.g. {where}=[1,2]; got {values!r}")
    if not values:
        raise UsageError(f"{where} is empty: give it at least one value, or leave it out")
    bad = next((v for v in values if not isinstance(v, SCALARS)), None)
    if bad is not None:
        raise UsageError(f"every value of {where} must be a number, string or boolean; got {bad!r}")
    return tuple(values)


def expand(sweeps: Iterable[Sweep], bases: Iterable[str], check: Callable[[str, dict], None]) -> list[SweptRow]:
    """The rows of `sweeps` in order; a row outside `bases`, options `check(row, options)` refuses, or one name
    given twice with other settings is a usage error. The same row twice with the same settings is one row."""
    known, out = list(dict.fromkeys(bases)), {}
    for s in sweeps:
        where = s.key or f"sweep.{s.row}.{s.option}"
        if s.row not in known:
            raise UsageError(f"{where}: no row {s.row!r} to sweep; known: {', '.join(known)}")
        for v in s.values:
            try:
                check(s.row, s.options(v))
            except UsageError as e:
                raise UsageError(f"{where}: {e}") from None
            row = SweptRow(s.name(v), s.row, s.options(v))
            if row.name in out and out[row.name] != row:
                raise UsageError(f"sweep row {row.name} is given twice with different settings; give each value once")
            out[row.name] = row
    return list(out.values())


def merged_table(old: dict | None, new: dict | None, old_name: str) -> dict:
    """One row -> {option: value} table from the older key (`method_options`, `row_options`) and `options`;
    a setting both give with different values is refused (which one wins would be a guess), and so is an entry
    that is no mapping (a bare `options.OPTION` means nothing where rows are of several methods)."""
    for name, table in ((old_name, old), ("options", new)):
        bad = next((k for k, v in (table or {}).items() if not isinstance(v, dict)), None)
        if bad is not None:
            raise UsageError(f"{name}.{bad} must map a row's options to values, e.g. options.ROW.{bad}=VALUE; "
                             f"got {table[bad]!r}")
    out = {k: dict(v) for k, v in (old or {}).items()}
    for key, value in (new or {}).items():
        for option, v in value.items():
            if option in out.get(key, {}) and out[key][option] != v:
                raise UsageError(f"{old_name}.{key}.{option} ({out[key][option]!r}) and options.{key}.{option} "
                                 f"({v!r}) disagree: {old_name} is the older name of options; set it once")
        out[key] = {**out.get(key, {}), **value}
    return out


def options_table(cfg) -> dict:
    """row -> {option: value} of `options` and its older name `method_options` (a disagreement is refused)."""
    return merged_table(cfg.method_options, cfg.options, "method_options")


def with_sweep_rows(cfg, modality: str, method_of: Callable[[str], str], extra: Iterable[SweptRow] = (),
                    sweepable: Callable[[str], bool] = lambda row: True) -> tuple[Any, list[SweptRow]]:
    """(cfg with `extra` and every `sweep` row added to `methods`, `options` holding every row's, and the rows added)
    of humaneval/images: a sweep varies a row, an `options` entry or a method of the suite's `modality` (one
    `sweepable` keeps), each value checked by its method's options; a suite without an `ar` row is refused. (An
    `options` entry no row reads is refused as the run's config loads: `Entries`, `dry_run.picked_rows`.)

    A swept row's entry is its base's own entry (a method's entry every row of the method reads anyway) with the
    swept option set; an entry the recipe gives for the swept row's name itself goes over that. A name already in
    `methods` is not repeated."""
    table = options_table(cfg)
    bases = [m for m in [*cfg.methods, *table, *methods_on(modality)] if sweepable(m)]
    swept = [*extra, *expand(sweeps_of(cfg.sweep), bases,
                             lambda row, options: get_method(method_of(row)).parse_options(options))]
    methods = list(cfg.methods)
    if "ar" not in methods:
        raise UsageError("the benchmark needs the 'ar' row: speedups and exact match are measured against it")
    for r in swept:
        own = table.get(r.base, {}) if r.base != method_of(r.base) else {}
        table[r.name] = {**own, **r.options, **table.get(r.name, {})}
        methods += [] if r.name in methods else [r.name]
    return replace(cfg, methods=methods, options=table, method_options={}, sweep={}), swept
