"""Shared Annotated options, declared once and reused by every command."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from specgen.config import read_recipe
from specgen.errors import UsageError


class Format(str, Enum):
    table = "table"
    json = "json"


def given_path(value: str, way_on: str) -> str:
    """A path option's value (typer's `parser` below): an empty one, as an unset shell variable in quotes gives, is
    refused, where Path("") would be the current folder (written into, or read) and an empty source dropped unsaid."""
    if value == "":
        raise typer.BadParameter(f"an empty path (an unset shell variable?); {way_on}")
    return value


def out_path(value: str) -> Path:
    """An output path option's value; `-` is refused: it names stdin/stdout elsewhere on this command line (`--prompts
    -`, `export-mesh -`), so `--out -` asks for the results on stdout, where it made a file or folder named `-` unsaid
    (results reach stdout with --format json; `./-` still names such a file)."""
    if given_path(value, "name a folder, or . for this one") == "-":
        raise typer.BadParameter("- is no stdout here: this option names a file or folder to write (the results are on "
                                 "stdout with --format json); for a path named '-', give ./-")
    return Path(value)


def in_path(value: str) -> Path:
    return Path(given_path(value, "name a file or folder"))


def prompt_source(value: str) -> str:
    """A --prompts source: a path, or `-` (stdin) and such names, kept as given."""
    return given_path(value, "name a file, or - for stdin")


ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", "-c", parser=in_path, help="YAML recipe (e.g. recipes/tiny/....yaml).")]
OverridesArg = Annotated[Optional[list[str]], typer.Argument(help="key=value overrides of recipe keys.", show_default=False)]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Results on stdout as a table or JSON.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed (sampling, drafts, data).")]
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="cpu, cuda, cuda:N or auto (cuda when present, else cpu); a missing device is refused.")]
GraphsOpt = Annotated[Optional[str], typer.Option(
    "--graphs", help="auto, on or off: decode steps as CUDA-graph replays (auto: on for CUDA; on a CPU, on is refused).")]
PromptFieldOpt = Annotated[Optional[str], typer.Option(
    "--prompt-field", help="\\[text] The record field holding the prompt in a --prompts file (default: prompt, text, "
                           "instruction, messages or turns).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars, per-item lines, notes or summary "
                                        "tables on stderr; results stay on stdout.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace existing registry entries of the output names "
                                                        "(never a built-in's).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Target: registry name, kind/name, or a checkpoint folder.")]
#: the methods by modality, as `--help` lists them (tests/cli/test_cli_refusals.py checks it against METHODS; importing
#: specgen.methods here would load the decoding stack before any command runs)
METHOD_NAMES = {"text": ("jacobi", "ngram", "cllm", "pcllm", "pcllm-mr"),
                "image": ("eagle2", "adt-tree", "lantern", "adt-tree+lantern", "vvs", "mulo-sd"), "mesh": ("xspecmesh",)}
#: how `--help` marks a method that does not keep the target's distribution (METHODS' lossless=False; the same test
#: checks it), as the README's method table does: xspecmesh is lossy by default, lossless with criterion=rejection
LOSSY_NOTES = {"lantern": "LOSSY", "adt-tree+lantern": "LOSSY", "vvs": "LOSSY", "mulo-sd": "LOSSY",
               "xspecmesh": "LOSSY unless method_options.criterion=rejection"}
MethodOpt = Annotated[Optional[str], typer.Option("--method", help="Decoding method: ar (the default; every modality); "
                      + "; ".join(f"{m} " + ", ".join(f"{n} ({LOSSY_NOTES[n]})" if n in LOSSY_NOTES else n
                                                      for n in names) for m, names in METHOD_NAMES.items())
                      + " (README, Methods; docs/methods/).")]
DtypeOpt = Annotated[Optional[str], typer.Option(
    "--dtype", help="Weights/activations/KV cache: float32, bfloat16 or float16 (quantized text: bfloat16 "
                    "activations; docs/precision.md).")]
QuantizeOpt = Annotated[Optional[str], typer.Option(
    "--quantize", help="Weight-only int8 or int4 (stored once as a derived registry entry; docs/precision.md).")]


def prompt_text(value: str) -> str:
    """A `--prompt` (typer's `parser`): a blank one, as an unset shell variable in quotes gives, is refused, as a
    prompt file's blank prompt is, where it would be decoded from the chat template's tokens alone."""
    if not value.strip():
        raise typer.BadParameter("an empty prompt (an unset shell variable?); give some text")
    return value


def comma_list(option: str, value: str | None, what: str, example: str) -> list[str] | None:
    """The stripped items of a comma-separated option (None when it is not given). An empty item (`1,,2`, a
    trailing comma) is refused, not dropped: it is a typo, and dropping it would run something else unsaid."""
    if value is None:
        return None
    items = [x.strip() for x in value.split(",")]
    problem = f"names no {what}" if not any(items) else "has an empty item" if not all(items) else ""
    if problem:
        raise UsageError(f"{option} {value!r} {problem}; give a comma-separated list such as {example}")
    return items


def recipe_key(config: Path | None, overrides: list[str] | None, key: str) -> str | None:
    """A recipe key as the config will load it (last override, else the file's), read before loading to pick the
    runner; None when neither sets it or the file does not parse (the config loader reports that)."""
    given = [o.split("=", 1)[1] for o in overrides or [] if o.startswith(f"{key}=")]
    if given:
        return given[-1]
    try:
        value = read_recipe(config).get(key) if config is not None else None
    except UsageError:
        return None
    return value if isinstance(value, str) else None
