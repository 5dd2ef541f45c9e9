"""Code-instruction prompts derived offline from the Python standard library's documented functions.

A pure function of the interpreter's stdlib (walked in a fresh `python -I -S`); never contains HumanEval problems.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

if __name__ == "__main__":  # the walker subprocess of stdlib_functions(): no specgen on its path, none needed
    UsageError = RuntimeFailure = type("Unused", (Exception,), {})
else:
    from specgen.errors import RuntimeFailure, UsageError
    from specgen.eval.humaneval import INSTRUCTION, load_problems

# Modules whose public functions become prompts (fixed order; a module missing from this build is skipped).
# Functions of the "pure" modules also get a "reimplement it without importing the module" template.
PURE_MODULES = (
    "base64 binascii bisect builtins calendar cmath colorsys copy csv datetime difflib email.header email.utils "
    "fnmatch fractions functools getopt glob graphlib heapq html html.parser http.cookies ipaddress itertools json "
    "keyword math mimetypes operator os.path pprint quopri random re reprlib shlex statistics string struct "
    "textwrap tokenize unicodedata urllib.parse uuid xml.dom.minidom xml.etree.ElementTree zlib"
).split()
SYSTEM_MODULES = (
    "abc argparse array ast bz2 codecs concurrent.futures configparser contextlib dataclasses decimal dis enum "
    "filecmp fileinput gettext gzip hashlib hmac inspect io linecache logging lzma os pathlib pickle plistlib queue "
    "secrets shutil stat subprocess tarfile tempfile time timeit tomllib traceback types typing warnings weakref "
    "zipfile zoneinfo"
).split()
PYTHON_ONLY = {"os"}  # of these, only functions written in Python (os.walk, not the os.getpid system call)

# Classes whose public methods become prompts: (module, class, name given to `self`).
# fmt: off
CLASSES = (
    ("builtins", "str", "text"), ("builtins", "bytes", "data"), ("builtins", "bytearray", "buffer"),
    ("builtins", "list", "items"), ("builtins", "dict", "mapping"), ("builtins", "set", "values"),
    ("builtins", "frozenset", "values"), ("builtins", "int", "n"), ("builtins", "float", "x"),
    ("builtins", "complex", "z"), ("builtins", "tuple", "items"), ("builtins", "range", "r"),
    ("builtins", "memoryview", "view"), ("collections", "Counter", "counter"), ("collections", "deque", "queue"),
    ("collections", "OrderedDict", "mapping"), ("collections", "ChainMap", "chain"),
    ("datetime", "date", "day"), ("datetime", "datetime", "moment"), ("datetime", "timedelta", "delta"),
    ("datetime", "time", "clock"), ("datetime", "timezone", "tz"), ("decimal", "Decimal", "d"),
    ("fractions", "Fraction", "q"), ("pathlib", "PurePath", "path"),
    ("pathlib", "Path", "path"), ("ipaddress", "IPv4Address", "address"), ("ipaddress", "IPv4Network", "network"),
    ("ipaddress", "IPv6Address", "address"), ("ipaddress", "IPv6Network", "network"),
    ("difflib", "SequenceMatcher", "matcher"), ("difflib", "Differ", "differ"), ("difflib", "HtmlDiff", "differ"),
    ("textwrap", "TextWrapper", "wrapper"), ("string", "Formatter", "formatter"), ("string", "Template", "template"),
    ("statistics", "NormalDist", "dist"), ("array", "array", "arr"), ("random", "Random", "rng"),
    ("configparser", "ConfigParser", "parser"), ("argparse", "ArgumentParser", "parser"),
    ("csv", "DictReader", "reader"), ("csv", "Sniffer", "sniffer"), ("json", "JSONDecoder", "decoder"),
    ("json", "JSONEncoder", "encoder"), ("html.parser", "HTMLParser", "parser"), ("zipfile", "ZipFile", "archive"),
    ("tarfile", "TarFile", "archive"), ("queue", "Queue", "queue"),
    ("email.message", "EmailMessage", "message"), ("email.message", "Message", "message"),
    ("xml.etree.ElementTree", "Element", "element"), ("xml.etree.ElementTree", "ElementTree", "tree"),
    ("urllib.parse", "SplitResult", "parts"), ("uuid", "UUID", "uid"), ("logging", "Logger", "logger"),
    ("logging", "Formatter", "formatter"), ("threading", "Event", "event"), ("threading", "Condition", "condition"),
    ("threading", "Semaphore", "semaphore"), ("io", "StringIO", "stream"), ("io", "BytesIO", "stream"),
    ("zoneinfo", "ZoneInfo", "zone"), ("graphlib", "TopologicalSorter", "sorter"),
    ("calendar", "Calendar", "cal"), ("calendar", "TextCalendar", "cal"), ("shlex", "shlex", "lexer"),
    ("ast", "NodeVisitor", "visitor"), ("ast", "NodeTransformer", "transformer"),
    ("inspect", "Signature", "signature"), ("inspect", "Parameter", "parameter"), ("struct", "Struct", "layout"),
    ("re", "Pattern", "pattern"), ("re", "Match", "match"),
)
# fmt: on

_SKIP_WORDS = re.compile(
    r"deprecated|alias|same as|see |undocumented|internal|backward|compatib|xxx|todo|\bfor use by\b|"
    r"not meant|private|override|subclass|this method|this function|call this|>>>",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<=[.!?])\s+")
_SIGNATURE_LINE = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")
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


@dataclass(frozen=True)
class StdlibPrompt:
    """One instruction and the function and template it came from."""

    text: str
    source: str
    template: str


class HumanEvalOverlapError(UsageError, ValueError):
    """Prompts meant for training contain (part of) a HumanEval problem."""


# --- the HumanEval overlap check ------------------------------------------------------------------

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
    """(index, task_id) of each prompt that contains a whole HumanEval prompt, shares a 13-word span with
    one, or names a HumanEval entry point and shares an 8-word span with that problem (case and
    whitespace ignored)."""
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


# --- walking the standard library (runs in the isolated subprocess) ---------------------------------


def _first_sentence(doc: str | None) -> str | None:
    """The docstring's first sentence if it reads as a plain description, else None."""
    if not doc:
        return None
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]
    while paragraphs and (_SIGNATURE_LINE.match(paragraphs[0]) or "->" in paragraphs[0].split(". ")[0]):
        paragraphs.pop(0)  # a C function's "name(args) -> result" line
    if not paragraphs:
        return None
    sentence = _SENTENCE_END.split(paragraphs[0])[0].rstrip(":;, ")
    if not (15 <= len(sentence) <= 220) or not sentence[0].isupper() or _SKIP_WORDS.search(sentence):
        return None
    if "`" in sentence or "0x" in sentence:
        return None
    return sentence if sentence.endswith((".", "!", "?")) else sentence + "."


def _default(value: object) -> str:
    """A default value as source text; anything but a short literal becomes None."""
    kind = type(value)  # exact types: an IntEnum's repr is not source
    if value is None or kind is bool or (kind is int and abs(value) < 10**9):
        return repr(value)
    if kind is float and value == value and abs(value) != float("inf"):
        return repr(value)
    if kind in (str, bytes) and len(value) <= 16 and value.isascii() and "\n" not in repr(value):
        return repr(value)
    return "None"


def _params(func: object, first: str | None) -> str | None:
    """The parameter list as valid Python source (no annotations, no private `_x=` parameters)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    out: list[str] = []
    star = seen_default = False
    for i, p in enumerate(sig.parameters.values()):
        if p.name.startswith("_") and p.default is not p.empty:
            continue  # an implementation detail such as copy.deepcopy's `_nil`
        name = first if (i == 0 and first and p.name in ("self", "cls")) else p.name
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append(f"**{name}")
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                out.append("*")
                star = True
            if p.default is not p.empty:
                out.append(f"{name}={_default(p.default)}")
                seen_default = True
            else:  # after a defaulted positional parameter a required one is not valid source
                out.append(f"{name}=None" if seen_default and not star else name)
    text = ", ".join(out)
    return text if len(text) <= 120 and " at 0x" not in text else None


def _import(name: str) -> object | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except ImportError:
            return None


def _walk() -> list[dict[str, str]]:
    """Documented public functions and methods, in a fixed order; call only in a clean interpreter."""
    found: list[dict[str, str]] = []

    def add(module: str, qualname: str, name: str, obj: object, first: str | None) -> None:
        sentence = _first_sentence(inspect.getdoc(obj))
        params = _params(obj, first) if sentence else None
        if params is not None:
            found.append(dict(module=module, qualname=qualname, name=name, params=params, sentence=sentence))

    for module_name in PURE_MODULES + SYSTEM_MODULES:
        module = _import(module_name)
        for attr in sorted(vars(module)) if module else ():
            obj = vars(module)[attr]
            builtin_ok = inspect.isbuiltin(obj) and module_name not in PYTHON_ONLY
            if not attr.startswith("_") and (inspect.isfunction(obj) or builtin_ok) and obj.__name__ == attr:
                add(module_name, attr, attr, obj, None)
    for module_name, class_name, first in CLASSES:
        module = _import(module_name)
        cls = getattr(module, class_name, None)
        if not inspect.isclass(cls):
            continue
        for attr in sorted(vars(cls)):
            raw = vars(cls)[attr]
            obj = getattr(cls, attr)
            if attr.startswith("_") or isinstance(raw, property) or not callable(obj) or inspect.isclass(obj):
                continue
            bound = isinstance(raw, (staticmethod, classmethod)) or inspect.isbuiltin(obj)  # no `self`
            add(module_name, f"{class_name}.{attr}", f"{class_name.lower()}_{attr}", obj, None if bound else first)
    return found


@lru_cache(maxsize=1)
def stdlib_functions() -> tuple[StdlibFunction, ...]:
    """The documented functions the prompts come from, walked in a fresh `python -I -S` interpreter,
    without HumanEval entry-point names and without repeats of a (name, first sentence) pair."""
    script = str(Path(__file__).resolve())  # run as a script: -I keeps its folder off sys.path
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


# --- templates ------------------------------------------------------------------------------------


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


def _prose_prompts(f: StdlibFunction) -> list[tuple[str, str]]:
    """Natural-language instructions for `f` as (template, text)."""
    call = f"`{f.name}({f.params})`"
    names = [p.split("=")[0].lstrip("*") for p in f.params.split(", ") if p and p != "*"]
    if not names:
        takes = "takes no arguments"
    elif len(names) == 1:
        takes = f"takes one argument, `{names[0]}`"
    else:
        takes = "takes the arguments " + ", ".join(f"`{n}`" for n in names[:-1]) + f" and `{names[-1]}`"
    out = []
    third = _third_person(f.sentence)
    if third:
        out.append(("verb", f"Write a Python function {call} that {third}"))
    out.append(("signature", f"Write a Python function {call}. {f.sentence}"))
    out.append(("named", f"Write a Python function named `{f.name}` that {takes}. {f.sentence}"))
    if f.module in PURE_MODULES and f.module != "builtins":
        top = f.module.split(".")[0]
        out.append(
            (
                "reimplement",
                f"Without importing `{top}`, write a Python function {call} that behaves like "
                f"`{f.module}.{f.qualname}`: {f.sentence}",
            )
        )
    return out


@lru_cache(maxsize=1)
def _build() -> tuple[StdlibPrompt, ...]:
    """Per function: the docstring request plus two prose templates picked by a hash of its name."""
    prompts: dict[str, StdlibPrompt] = {}
    for f in stdlib_functions():
        source = f"{f.module}.{f.qualname}"
        prose = _prose_prompts(f)
        k = _digest(source) % len(prose)
        for template, text in [("docstring", _docstring_prompt(f)), prose[k], prose[(k + 1) % len(prose)]]:
            prompts.setdefault(text, StdlibPrompt(text, source, template))
    ordered = sorted(prompts.values(), key=lambda p: (_digest(p.text), p.text))  # a seed-free shuffle
    assert_no_humaneval_overlap([p.text for p in ordered])
    return tuple(ordered)


def stdlib_prompt_records(limit: int | None = None) -> list[StdlibPrompt]:
    """The prompt set with provenance, in its fixed pseudo-random order."""
    return list(_build()[:limit])


def stdlib_prompts(limit: int | None = None) -> list[str]:
    """The first `limit` prompts (all by default) of the built-in stdlib-derived training set."""
    return [p.text for p in _build()[:limit]]


def stdlib_fingerprint() -> str:
    """`python3.11-<hash>`: names the exact set; record it next to trajectories built from it."""
    digest = hashlib.sha256("\n\0".join(stdlib_prompts()).encode("utf-8")).hexdigest()[:12]
    return f"python{sys.version_info.major}.{sys.version_info.minor}-{digest}"


if __name__ == "__main__":  # the walker subprocess of stdlib_functions()
    sys.stdout.write(json.dumps(_walk()))
