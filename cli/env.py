"""`specgen env`: this machine's devices, ISA, threads, kernel paths, caches and native build, on one screen."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli import _output
from cli._errors import command
from cli._options import DeviceOpt, Format
from specgen.errors import UsageError

EPILOG = """examples:

  specgen env

  specgen env --device cuda          # the kernel paths a GPU run takes

  specgen env --format json | jq .kernels
"""


@command
def env(
    device: DeviceOpt = None,
    fmt: Annotated[Optional[Format], typer.Option(  # None: not given, so --json may pick json
        "--format", "-f", help="Results on stdout as a table (the default) or JSON.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The same as --format json.")] = False,
) -> None:
    """Show what decides how specgen runs here: devices, ISA flags, threads, each model family's kernels, caches."""
    from specgen import devices, machine  # deferred: start-up (torch; `specgen --help` does without it)
    from specgen.config_checks import check_value  # deferred: start-up (it imports torch)

    if as_json and fmt == Format.table:  # one would be ignored unsaid
        raise UsageError("--json is --format json and contradicts --format table; give one of them")
    check_value("device", device)  # "" (an unset shell variable) refused as every command's --device, not cpu
    facts = machine.machine_facts(devices.device_name(device or "cpu"))  # a missing device: one line
    if as_json or fmt == Format.json:  # --format as every command takes it; --json, its older spelling, kept
        _output.emit_json(facts)
        return
    _output.table("specgen env", rows(facts), ["item", "value", "detail"], _output.out)


def rows(facts: dict) -> list[dict]:
    """The facts as (item, value, detail) rows of one table."""
    from specgen.memory import size  # deferred: start-up (torch; `specgen --help` does without it)

    cpu, *gpus = facts["devices"]
    t = facts["threads"]
    out = [{"item": "device cpu", "value": cpu["model"], "detail": f"{cpu['arch']}, {cpu['cpus']} cpus"}]
    out += [{"item": f"device {g['name']}", "value": g["model"], "detail": f"{g['memory_gib']} GiB"} for g in gpus]
    out += [{"item": "isa", "value": " ".join(facts["isa"]) or "-", "detail": "flags that pick kernels"},
            {"item": "threads", "value": t["torch"], "detail": f"torch threads; {t['usable_cpus']} of {t['cpus']} "
                                                               "cpus usable"},
            {"item": "torch", "value": facts["torch"], "detail": f"CUDA {facts['cuda'] or '-'}"}]
    out += [{"item": f"kernels {family}", "value": k["path"], "detail": k["why"]}
            for family, k in facts["kernels"].items()]
    out += [{"item": f"cache {name}", "value": c["path"], "detail": size(c["bytes"]) if c["exists"] else "absent"}
            for name, c in facts["caches"].items()]
    libs = facts["native"]["libraries"]
    out += [{"item": "c compiler", "value": facts["native"]["compiler"] or "none", "detail": "$CC, else cc"},
            {"item": "native build", "value": ", ".join(n for n, ok in libs.items() if ok) or "none",
             "detail": "missing: " + ", ".join(n for n, ok in libs.items() if not ok) if not all(libs.values())
             else "every library loads"}]
    return out

