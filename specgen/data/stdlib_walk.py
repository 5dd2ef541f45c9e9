"""The walker of stdlib_prompts, run alone in a fresh `python -I -S` (stdlib imports only): documented functions."""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
import warnings

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

# Classes whose public methods become prompts: module -> "Class:name-of-self ..." (fixed order).
CLASSES = {
    "builtins": "str:text bytes:data bytearray:buffer list:items dict:mapping set:values frozenset:values int:n "
                "float:x complex:z tuple:items range:r memoryview:view",
    "collections": "Counter:counter deque:queue OrderedDict:mapping ChainMap:chain",
    "datetime": "date:day datetime:moment timedelta:delta time:clock timezone:tz", "decimal": "Decimal:d",
    "fractions": "Fraction:q", "pathlib": "PurePath:path Path:path",
    "ipaddress": "IPv4Address:address IPv4Network:network IPv6Address:address IPv6Network:network",
    "difflib": "SequenceMatcher:matcher Differ:differ HtmlDiff:differ", "textwrap": "TextWrapper:wrapper",
    "string": "Formatter:formatter Template:template", "statistics": "NormalDist:dist", "array": "array:arr",
    "random": "Random:rng", "configparser": "ConfigParser:parser", "argparse": "ArgumentParser:parser",
    "csv": "DictReader:reader Sniffer:sniffer", "json": "JSONDecoder:decoder JSONEncoder:encoder",
    "html.parser": "HTMLParser:parser", "zipfile": "ZipFile:archive", "tarfile": "TarFile:archive",
    "queue": "Queue:queue", "email.message": "EmailMessage:message Message:message",
    "xml.etree.ElementTree": "Element:element ElementTree:tree", "urllib.parse": "SplitResult:parts",
    "uuid": "UUID:uid", "logging": "Logger:logger Formatter:formatter",
    "threading": "Event:event Condition:condition Semaphore:semaphore", "io": "StringIO:stream BytesIO:stream",
    "zoneinfo": "ZoneInfo:zone", "graphlib": "TopologicalSorter:sorter", "calendar": "Calendar:cal TextCalendar:cal",
    "shlex": "shlex:lexer", "ast": "NodeVisitor:visitor NodeTransformer:transformer",
    "inspect": "Signature:signature Parameter:parameter", "struct": "Struct:layout",
    "re": "Pattern:pattern Match:match",
}

_SKIP_WORDS = re.compile(
    r"deprecated|alias|same as|see |undocumented|internal|backward|compatib|xxx|todo|\bfor use by\b|"
    r"not meant|private|override|subclass|this method|this function|call this|>>>",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<=[.!?])\s+")
_SIGNATURE_LINE = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")


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
    for module_name, class_name, first in [(m, *c.split(":")) for m, cs in CLASSES.items() for c in cs.split()]:
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


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_walk()))
