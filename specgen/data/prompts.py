"""Read prompts from a text file, a JSONL file, stdin, or a local `datasets` dataset / parquet / json file."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from specgen.data.stdlib_prompts import assert_no_humaneval_overlap
from specgen.errors import UsageError

FIELDS = ("prompt", "text", "instruction")  # looked up in this order when no field is named
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
DATASETS_SUFFIXES = {".parquet": "parquet", ".json": "json", ".arrow": "arrow"}


class PromptSourceError(UsageError, ValueError):
    """A prompt source is missing, empty, or malformed; the message is one line naming the problem."""


def _pick(row: dict, field: str | None, where: str) -> str:
    """The prompt in one record: `field`, or the first of FIELDS present; must be a non-empty string."""
    if field is not None:
        if field not in row:
            raise PromptSourceError(f"{where}: no field '{field}'")
        name = field
    else:
        name = next((f for f in FIELDS if f in row), None)
        if name is None:
            have = ", ".join(map(str, row)) or "none"
            raise PromptSourceError(f"{where}: no field 'prompt', 'text' or 'instruction' (fields: {have})")
    value = row[name]
    if not isinstance(value, str) or not value.strip():
        raise PromptSourceError(f"{where}: field '{name}' is not a non-empty string")
    return value


def _parse_text(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _parse_jsonl(text: str, field: str | None, name: str) -> list[str]:
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptSourceError(f"{name} line {number}: invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise PromptSourceError(f"{name} line {number}: expected a JSON object, got {type(row).__name__}")
        prompts.append(_pick(row, field, f"{name} line {number}"))
    return prompts


def _read_dataset(path: Path, field: str | None, split: str) -> list[str]:
    """A `datasets` directory (save_to_disk) or a parquet/json/arrow file, read without network."""
    try:
        import datasets
    except ImportError:
        raise PromptSourceError(f"{path}: reading datasets needs the `datasets` package") from None
    bars, verbosity = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()  # stderr belongs to the caller (its one error line included); restored below
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        if path.is_dir():
            data = datasets.load_from_disk(str(path))
        else:  # build into a throw-away cache: nothing is left behind in ~/.cache
            with tempfile.TemporaryDirectory(prefix="specgen-prompts-") as cache:
                data = datasets.load_dataset(
                    DATASETS_SUFFIXES[path.suffix.lower()],
                    data_files=str(path),
                    split=split,
                    cache_dir=cache,
                    keep_in_memory=True,
                )
    except (FileNotFoundError, ValueError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PromptSourceError(f"{path}: cannot read as a dataset ({reason})") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise PromptSourceError(f"{path}: no split '{split}' (splits: {', '.join(data)})")
        data = data[split]
    columns = list(data.column_names)
    name = field or next((f for f in FIELDS if f in columns), None)
    if name is None or name not in columns:
        wanted = f"'{field}'" if field else "'prompt', 'text' or 'instruction'"
        raise PromptSourceError(f"{path}: no column {wanted} (columns: {', '.join(columns) or 'none'})")
    values = data[name]
    for i, value in enumerate(values):
        if not isinstance(value, str) or not value.strip():
            raise PromptSourceError(f"{path} row {i}: column '{name}' is not a non-empty string")
    return list(values)


def read_prompts(
    source: str | Path, field: str | None = None, fmt: str | None = None, split: str = "train"
) -> list[str]:
    """Prompts from `source`, in order.

    source: a text file (one prompt per line, blank lines skipped), a `.jsonl`/`.ndjson` file (one
    object per line; the prompt is `field`, else the first of prompt/text/instruction), `-` for stdin
    (JSONL when the first non-blank line starts with `{`, else text), a `datasets` directory written by
    `save_to_disk`, or a local `.parquet`/`.json`/`.arrow` file. `fmt` ("text" or "jsonl") overrides the
    guess for files and stdin; `split` picks the split of a DatasetDict.
    """
    if fmt not in (None, "text", "jsonl"):
        raise PromptSourceError(f"unknown prompt format '{fmt}' (use text or jsonl)")
    if str(source) == "-":
        try:
            name, text = "<stdin>", sys.stdin.read()
            text.encode("utf-8")  # bytes that are not UTF-8 arrive as surrogates (surrogateescape) or raise
        except UnicodeError:
            raise PromptSourceError("<stdin>: not UTF-8 text") from None
    else:
        path = Path(source).expanduser()
        name = str(path)
        if not path.exists():
            raise PromptSourceError(f"prompt file not found: {path}")
        if fmt is None and (path.is_dir() or path.suffix.lower() in DATASETS_SUFFIXES):
            prompts = _read_dataset(path, field, split)
            if not prompts:
                raise PromptSourceError(f"{path}: the dataset has no rows")
            return prompts
        if path.is_dir():
            raise PromptSourceError(f"{path} is a directory, not a {fmt} file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise PromptSourceError(f"{path}: not UTF-8 text") from None
        if fmt is None:
            fmt = "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "text"
    if fmt is None:
        first = next((line for line in text.splitlines() if line.strip()), "")
        fmt = "jsonl" if first.lstrip().startswith("{") else "text"
    prompts = _parse_jsonl(text, field, name) if fmt == "jsonl" else _parse_text(text)
    if not prompts:
        raise PromptSourceError(f"{name}: no prompts (the input is empty)")
    return prompts


def guard_training_prompts(prompts: list[str]) -> list[str]:
    """Return `prompts` unchanged, or raise HumanEvalOverlapError if any overlaps a HumanEval problem."""
    assert_no_humaneval_overlap(prompts)
    return prompts
