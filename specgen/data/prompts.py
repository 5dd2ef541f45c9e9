"""Read prompts from lines, JSON Lines, stdin or a local dataset (docs/recipes.md)."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

from specgen.errors import UsageError

FIELDS = ("prompt", "text", "instruction", "messages", "turns")  # looked up in this order when no field is named
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
DATASETS_SUFFIXES = {".parquet": "parquet", ".json": "json", ".arrow": "arrow", ".csv": "csv"}


class PromptSourceError(UsageError, ValueError):
    """A prompt source is missing, empty, or malformed; the message is one line naming the problem."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: a user message's text, or a whole chat as ({role, content}, ...) messages."""

    content: str | tuple[dict, ...]
    category: str = ""


def encode(tokenizer, prompt: Prompt, chat: bool = True) -> list[int]:
    """Prompt token ids: text as one user turn (raw with `chat` False), messages as they are (the tokenizer's chat
    template when it has one: a chat has no raw form)."""
    if isinstance(prompt.content, str):
        return tokenizer.encode(prompt.content, chat=chat)
    return tokenizer.encode_chat(list(prompt.content))


def _content(value, name: str, where: str) -> str | tuple[dict, ...]:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        if all(isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
            return tuple({"role": m["role"], "content": m["content"]} for m in value)
        raise PromptSourceError(f"{where}: field '{name}' holds messages without a string 'role' and 'content'")
    if isinstance(value, list) and value and isinstance(value[0], str) and value[0].strip():
        return value[0]  # a conversation's turns: the first one
    raise PromptSourceError(f"{where}: field '{name}' is not a non-empty string, messages or turns")


def record(row: dict, field: str | None, category_field: str | None, where: str) -> Prompt:
    """The prompt of one record (a JSON object or a dataset row)."""
    if not isinstance(row, dict):
        raise PromptSourceError(f"{where}: expected a JSON object, got {type(row).__name__}")
    name = field or next((f for f in FIELDS if f in row), None)
    if name is None:
        have = ", ".join(map(str, row)) or "none"
        raise PromptSourceError(f"{where}: no field {', '.join(map(repr, FIELDS))} (fields: {have})")
    if name not in row:
        raise PromptSourceError(f"{where}: no field '{name}'")
    if category_field is not None and category_field not in row:
        raise PromptSourceError(f"{where}: no category field '{category_field}'")
    category = row.get(category_field or "category")
    return Prompt(_content(row[name], name, where), "" if category is None else str(category))


class Source(NamedTuple):
    """A text source as read: its name for messages, its path (None for stdin), its text."""

    name: str
    path: Path | None
    text: str


def json_lines(src: Source) -> Iterator[tuple[int, object]]:
    """(line number, value) per non-empty line of JSON Lines text; a line that is no JSON is refused, naming it."""
    for number, line in enumerate(src.text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptSourceError(f"{src.name} line {number}: invalid JSON ({exc.msg})") from None
        except RecursionError:  # json.loads of arrays or objects nested thousands deep
            raise PromptSourceError(f"{src.name} line {number}: invalid JSON (nested too deep)") from None
        yield number, value


def _dataset(path: Path, field: str | None, category_field: str | None) -> list[Prompt]:
    """A `datasets` folder (save_to_disk; of a DatasetDict its train split) or a parquet/json/arrow/csv file, read
    without network."""
    try:
        import datasets  # deferred: start-up (only dataset sources need it)
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
                data = datasets.load_dataset(DATASETS_SUFFIXES.get(path.suffix.lower(), "json"), data_files=str(path),
                                             split="train", cache_dir=cache, keep_in_memory=True)
    except (FileNotFoundError, ValueError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
        exc = exc.__cause__ or exc  # a generation error says only that one occurred: its cause says what
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PromptSourceError(f"{path}: cannot read as a dataset ({reason})") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise PromptSourceError(f"{path}: no split 'train' (splits: {', '.join(data)}); name a split's folder: "
                                    f"{path / next(iter(data))}")  # save_to_disk wrote each split as a dataset
        data = data["train"]
    columns = list(data.column_names)
    for wanted in (field, category_field):
        if wanted is not None and wanted not in columns:
            raise PromptSourceError(f"{path}: no column '{wanted}' (columns: {', '.join(columns) or 'none'})")
    if field is None and not set(FIELDS) & set(columns):
        raise PromptSourceError(f"{path}: no column {', '.join(map(repr, FIELDS))} (columns: {', '.join(columns)})")
    return [record(row, field, category_field, f"{path} row {i}") for i, row in enumerate(data)]


def read_text(source: str | Path, what: str) -> Source:
    """The text of stdin ("-") or of the file `what` (missing, a folder, unreadable or not UTF-8: one line)."""
    if str(source) == "-":
        try:
            text = sys.stdin.read().removeprefix("\ufeff")  # a byte order mark is no text (utf-8-sig, as files)
            text.encode("utf-8")  # bytes that are not UTF-8 arrive as surrogates (surrogateescape) or raise
        except UnicodeError:
            raise PromptSourceError("<stdin>: not UTF-8 text") from None
        return Source("<stdin>", None, text)
    path = Path(source).expanduser()
    if not path.exists():
        raise PromptSourceError(f"{what} not found: {path}")
    if path.is_dir():
        raise PromptSourceError(f"{path} is a directory, not a {what}")
    try:
        return Source(str(path), path, path.read_text(encoding="utf-8-sig"))  # a leading byte order mark dropped
    except UnicodeDecodeError:
        raise PromptSourceError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise PromptSourceError(f"cannot read {path}: {e.strerror or e}") from None


def read_prompt_records(source: str | Path, field: str | None = None,
                        category_field: str | None = None) -> list[Prompt]:
    """Prompts from `source` in order: a dataset (a folder, or a file named like one), else JSON Lines (named so, or
    a first line opening an object) or one prompt per line."""
    path = Path(source).expanduser()
    if str(source) != "-" and path.exists() and (path.is_dir() or path.suffix.lower() in DATASETS_SUFFIXES):
        prompts, name, empty = _dataset(path, field, category_field), str(path), "the dataset has no rows"
    else:
        src = read_text(source, "prompt file")
        first = next((line for line in src.text.splitlines() if line.strip()), "")
        jsonl = first.lstrip().startswith("{") or (src.path is not None and src.path.suffix.lower() in JSONL_SUFFIXES)
        if not jsonl and (field or category_field) is not None:  # a named field would be silently ignored
            raise PromptSourceError(f"{src.name}: a field ({field or category_field!r}) is named, but this is one "
                                    "prompt per line; give JSON Lines or a dataset, or drop the field")
        prompts = ([record(row, field, category_field, f"{src.name} line {n}") for n, row in json_lines(src)] if jsonl
                   else [Prompt(line.strip()) for line in src.text.splitlines() if line.strip()])
        name, empty = src.name, "no prompts (the input is empty)"
    if not prompts:
        raise PromptSourceError(f"{name}: {empty}")
    return prompts


def read_prompts(source: str | Path, field: str | None = None) -> list[str]:
    """The text prompts of `source` (`read_prompt_records`); a chat record is refused, naming which."""
    records = read_prompt_records(source, field)
    chat = next((i for i, p in enumerate(records) if not isinstance(p.content, str)), None)
    if chat is not None:
        raise PromptSourceError(f"{'<stdin>' if str(source) == '-' else source}: prompt {chat} is a chat (`messages`); "
                                "this reads text prompts (`specgen generate` and `benchmark` read chats)")
    return [p.content for p in records]
