"""Shared Annotated options, declared once and reused by every command."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


class Format(str, Enum):
    table = "table"
    json = "json"


ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML recipe (e.g. recipes/tiny/....yaml).")]
OverridesArg = Annotated[Optional[list[str]], typer.Argument(help="key=value overrides of recipe keys.", show_default=False)]
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Results on stdout as a table or JSON.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed (sampling, drafts, data).")]
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="cpu, cuda, cuda:N or auto (cuda when present, else cpu); a missing device is refused.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or tables on stderr.")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Target: registry name, kind/name, or a checkpoint folder.")]
MethodOpt = Annotated[Optional[str], typer.Option("--method", help="Decoding method (see `specgen generate --help`).")]
DtypeOpt = Annotated[Optional[str], typer.Option(
    "--dtype", help="Weights/activations/KV cache: float32, bfloat16 or float16 (quantized text: bfloat16 "
                    "activations; docs/precision.md).")]
QuantizeOpt = Annotated[Optional[str], typer.Option(
    "--quantize", help="[text] Weight-only int8 or int4 (stored once as a derived registry entry; docs/precision.md).")]
