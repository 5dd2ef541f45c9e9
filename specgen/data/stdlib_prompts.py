"""Code-instruction prompts from the stdlib's documented functions: a pure function of the interpreter, no HumanEval."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specgen.data import stdlib_walk
from specgen.data.humaneval import INSTRUCTION, load_problems
from specgen.errors import RuntimeFailure, UsageError

_VERBS = (
    "add apply build calculate change check close compare compile compute construct convert copy count create "
    "decode decompress delete detect determine encode escape evaluate extract fill filter find flatten format "
    "generate get group guess insert join load make map match merge move normalize open pack parse pop quote "
    "raise read reduce remove rename replace reset resolve reverse round scan search select send set shift sort "
    "split strip substitute swap test translate truncate unescape unpack unquote update validate wrap write yield"
).split()


@dataclass(frozen=True)
class StdlibFunction:
    """One documented public function or method: where it lives, a Python signature, its first sentence."""

    module: str
    qualname: str
    name: str
    params: str
    sentence: str


class HumanEvalOverlapError(UsageError, ValueError):
    """Prompts meant for training contain (part of) a HumanEval problem."""


NGRAM = 13  # words shared with any HumanEval prompt that count as overlap (GPT-3's decontamination span)
NAMED_NGRAM = 8  # shorter span that counts when the prompt also names that problem's entry point


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


@lru_cache(maxsize=1)
def _humaneval_index() -> tuple[list[tuple[str, str, str, set]], dict[tuple[str, ...], str]]:
    """Per problem (task_id, entry point, normalized prompt, 8-grams), and every 13-gram -> task_id."""
    problems, long_grams = [], {}
    for p in load_problems():
        words = _words(p.prompt)
        problems.append((p.task_id, p.entry_point.lower(), _normalize(p.prompt), _ngrams(words, NAMED_NGRAM)))
        for gram in _ngrams(words, NGRAM):
            long_grams.setdefault(gram, p.task_id)
    return problems, long_grams


def find_humaneval_overlaps(prompts: list[str]) -> list[tuple[int, str]]:
    """(index, task_id) of each prompt that contains a whole HumanEval prompt, shares a 13-word span with one, or
    names a HumanEval entry point and shares an 8-word span with that problem (case and whitespace ignored)."""
    problems, long_grams = _humaneval_index()
    hits = []
    for i, prompt in enumerate(prompts):
        text, words = _normalize(prompt), _words(prompt)
        hit = next((task for task, _, norm, _ in problems if norm in text), None)
        hit = hit or next((long_grams[g] for g in _ngrams(words, NGRAM) if g in long_grams), None)
        if hit is None:
            named, grams = set(words), _ngrams(words, NAMED_NGRAM)
            hit = next((task for task, name, _, pg in problems if name in named and not grams.isdisjoint(pg)), None)
        if hit is not None:
            hits.append((i, hit))
    return hits


def assert_no_humaneval_overlap(prompts: list[str]) -> None:
    """Raise HumanEvalOverlapError if any prompt overlaps a HumanEval problem (see find_humaneval_overlaps)."""
    hits = find_humaneval_overlaps(prompts)
    if hits:
        index, task = hits[0]
        raise HumanEvalOverlapError(
            f"{len(hits)} prompt(s) overlap HumanEval (first: prompt {index + 1} ~ {task}); "
            "training prompts must not contain evaluation problems"
        )


@lru_cache(maxsize=1)
def stdlib_functions() -> tuple[StdlibFunction, ...]:
    """The documented functions the prompts come from, without HumanEval entry-point names or repeated
    (name, first sentence) pairs."""
    script = str(Path(stdlib_walk.__file__).resolve())  # run as a script: -I keeps its folder off sys.path
    proc = subprocess.run(
        [sys.executable, "-I", "-S", script], capture_output=True, text=True, encoding="utf-8", timeout=300
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeFailure(f"walking the standard library failed: {tail}")
    banned = {p.entry_point.lower() for p in load_problems()}
    out, seen = [], set()
    for row in json.loads(proc.stdout):
        bare = row["qualname"].rsplit(".", 1)[-1]
        if bare.lower() in banned or row["name"].lower() in banned or (bare, row["sentence"]) in seen:
            continue
        seen.add((bare, row["sentence"]))
        out.append(StdlibFunction(**row))
    return tuple(out)


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def _third_person(sentence: str) -> str | None:
    """'Return the x.' -> 'returns the x.' when the sentence starts with a known imperative verb."""
    verb, _, rest = sentence.partition(" ")
    verb = verb.lower()
    if verb not in _VERBS or not rest:
        return None
    if verb.endswith(("s", "x", "z", "ch", "sh")):
        verb += "es"
    elif verb.endswith("y") and verb[-2] not in "aeiou":
        verb = verb[:-1] + "ies"
    else:
        verb += "s"
    return f"{verb} {rest}"


def _docstring_prompt(f: StdlibFunction) -> str:
    """The HumanEval-style request: the same instruction, a stub with a one-line docstring."""
    return f'{INSTRUCTION}\n\n```python\ndef {f.name}({f.params}):\n    """{f.sentence}"""\n```'


def _prose_prompts(f: StdlibFunction) -> list[str]:
    """Natural-language instructions for `f`."""
    call = f"`{f.name}({f.params})`"
    names = [p.split("=")[0].lstrip("*") for p in f.params.split(", ") if p and p != "*"]
    if not names:
        takes = "takes no arguments"
    elif len(names) == 1:
        takes = f"takes one argument, `{names[0]}`"
    else:
        takes = "takes the arguments " + ", ".join(f"`{n}`" for n in names[:-1]) + f" and `{names[-1]}`"
    third = _third_person(f.sentence)
    out = [f"Write a Python function {call} that {third}"] if third else []
    out.append(f"Write a Python function {call}. {f.sentence}")
    out.append(f"Write a Python function named `{f.name}` that {takes}. {f.sentence}")
    if f.module in stdlib_walk.PURE_MODULES and f.module != "builtins":
        out.append(f"Without importing `{f.module.split('.')[0]}`, write a Python function {call} that behaves like "
                   f"`{f.module}.{f.qualname}`: {f.sentence}")
    return out


@lru_cache(maxsize=1)
def _build() -> tuple[str, ...]:
    """Per function: the docstring request plus two prose templates picked by a hash of its name."""
    prompts: dict[str, None] = {}
    for f in stdlib_functions():
        prose = _prose_prompts(f)
        k = _digest(f"{f.module}.{f.qualname}") % len(prose)
        prompts.update(dict.fromkeys([_docstring_prompt(f), prose[k], prose[(k + 1) % len(prose)]]))
    ordered = sorted(prompts, key=lambda text: (_digest(text), text))  # a seed-free shuffle
    assert_no_humaneval_overlap(ordered)
    return tuple(ordered)


def stdlib_prompts(limit: int | None = None) -> list[str]:
    """The first `limit` prompts (all by default) of the built-in stdlib-derived training set."""
    return list(_build()[:limit])


def stdlib_fingerprint() -> str:
    """`python3.11-<hash>`: names the exact set; record it next to trajectories built from it."""
    digest = hashlib.sha256("\n\0".join(stdlib_prompts()).encode("utf-8")).hexdigest()[:12]
    return f"python{sys.version_info.major}.{sys.version_info.minor}-{digest}"

