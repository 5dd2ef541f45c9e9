"""Prompt sources (text, JSONL, stdin, datasets) and the stdlib-derived training prompts."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.data.general_prompts import general_fingerprint, general_prompts
from specgen.data.prompts import PromptSourceError, read_prompt_records, read_prompts
from specgen.data.stdlib_prompts import (
    HumanEvalOverlapError,
    _ngrams,
    _words,
    assert_no_humaneval_overlap,
    find_humaneval_overlaps,
    stdlib_fingerprint,
    stdlib_functions,
    stdlib_prompts,
)
from specgen.data.humaneval import build_user_message, load_problems

ROOT = Path(__file__).resolve().parents[2]


# --- stdlib prompts -------------------------------------------------------------------------------


def test_stdlib_prompts_count_and_shape():
    prompts = stdlib_prompts()
    assert len(prompts) >= 2000
    assert len(set(prompts)) == len(prompts)
    starts = ("Write a Python function", "Complete the following", "Without importing")
    assert all(p.startswith(starts) for p in prompts)
    call = "Write a Python function `"  # the verb and signature templates start with the call itself
    templates = {"docstring": lambda p: p.startswith("Complete the following"),
                 "named": lambda p: p.startswith("Write a Python function named `"),
                 "reimplement": lambda p: p.startswith("Without importing `"),
                 "verb": lambda p: p.startswith(call) and ")` that " in p,
                 "signature": lambda p: p.startswith(call) and ")`. " in p}
    assert all(any(map(found, prompts)) for found in templates.values())
    assert stdlib_prompts(limit=5) == prompts[:5]


def test_stdlib_stubs_are_valid_python():
    stubs = [text.split("```python\n", 1)[1].rsplit("```", 1)[0] for text in stdlib_prompts()
             if text.startswith("Complete the following")]
    assert len(stubs) > 10  # a renamed lead-in would leave nothing to compile
    for code in stubs:
        compile(code, "<stub>", "exec")


def test_stdlib_prompts_identical_across_processes_and_hash_seeds():
    """This process and another one under another hash seed (this one's is random, or fixed by PYTHONHASHSEED)."""
    code = "from specgen.data.stdlib_prompts import stdlib_fingerprint; print(stdlib_fingerprint())"
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == stdlib_fingerprint()
    assert stdlib_fingerprint().startswith(f"python{sys.version_info.major}.{sys.version_info.minor}-")


def test_stdlib_prompts_never_touch_humaneval():
    prompts = stdlib_prompts()
    assert find_humaneval_overlaps(prompts) == []
    entry_points = {p.entry_point.lower() for p in load_problems()}
    assert not any(f.name.lower() in entry_points for f in stdlib_functions())  # e.g. statistics.median is left out


def test_overlap_guard_catches_planted_humaneval_prompts():
    problems = load_problems(limit=12)
    clean = stdlib_prompts(limit=50)
    planted = [
        problems[0].prompt,  # the prompt itself
        build_user_message(problems[3]),  # wrapped as the chat user turn
        # the docstring only, reflowed and re-cased
        "CHECK IF in given list of numbers, are any two numbers closer to each other than\n given threshold.",
        # the entry point by name plus an 8-word span of its docstring
        "Write rolling_max: from a given list of integers, generate a list of rolling maximum element.",
    ]
    prompts = clean[:10] + planted + clean[10:]
    hits = find_humaneval_overlaps(prompts)
    assert [i for i, _ in hits] == [10, 11, 12, 13]
    assert [task for _, task in hits] == ["HumanEval/0", "HumanEval/3", "HumanEval/0", "HumanEval/9"]
    first = r"4 prompt\(s\) overlap HumanEval \(first: prompt 11 ~ HumanEval/0\)"
    with pytest.raises(HumanEvalOverlapError, match=first):
        assert_no_humaneval_overlap(prompts)
    with pytest.raises(ValueError):
        assert_no_humaneval_overlap(prompts)
    assert_no_humaneval_overlap(clean)


def test_overlap_guard_allows_shared_names_without_shared_text():
    assert find_humaneval_overlaps(["Write a Python function `median(data)` that returns the middle value."]) == []


# --- general prompts (the n-gram cache's non-code half) ----------------------------------------------


def spans(text: str) -> set[tuple[str, ...]]:
    return _ngrams(_words(text), 6)


def mixed_set_texts() -> list[str]:
    return [p.content if isinstance(p.content, str) else " ".join(m["content"] for m in p.content)
            for p in read_prompt_records(ROOT / "specgen/data/mixed_prompts.jsonl")]


def test_general_prompts_are_many_distinct_and_fixed():
    prompts = general_prompts()
    assert len(prompts) >= 800 and len(set(prompts)) == len(prompts)
    assert general_prompts(5) == prompts[:5]
    code = "from specgen.data.general_prompts import general_fingerprint; print(general_fingerprint())"
    env = {**os.environ, "PYTHONHASHSEED": "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == general_fingerprint()


def test_general_prompts_share_no_text_with_the_benchmarks():
    """No 6-word span of the mixed set (the benchmark the cache serves) and no HumanEval overlap; the check itself
    catches a planted mixed-set prompt."""
    mixed = set().union(*map(spans, mixed_set_texts()))
    prompts = general_prompts()
    assert [p for p in prompts if spans(p) & mixed] == []
    assert spans(f"Please answer: {mixed_set_texts()[14]}") & mixed  # the control: a benchmark prompt is caught
    assert find_humaneval_overlaps(prompts) == []


# --- reading prompt sources -----------------------------------------------------------------------


def test_text_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  second prompt  \r\n\n", encoding="utf-8")
    assert read_prompts(path) == ["first prompt", "second prompt"]


def test_jsonl_file_and_field_choice(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "a"}, {"text": "b"}, {"instruction": "c", "id": 3}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert read_prompts(path) == ["a", "b", "c"]
    other = tmp_path / "q.jsonl"
    other.write_text('{"question": "x", "prompt": "ignored"}\n{"question": "y"}\n', encoding="utf-8")
    assert read_prompts(other, field="question") == ["x", "y"]


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\ntwo\n"))
    assert read_prompts("-") == ["one", "two"]
    monkeypatch.setattr(sys, "stdin", io.StringIO('\n{"prompt": "p1"}\n{"prompt": "p2"}\n'))
    assert read_prompts("-") == ["p1", "p2"]


def test_a_byte_order_mark_is_no_prompt_text(tmp_path, monkeypatch):
    """A UTF-8 BOM (Notepad's files) was read as text: a JSONL file not named .jsonl became one-prompt-a-line
    prompts of raw JSON, a .jsonl file was refused, and a plain prompt began with an invisible U+FEFF."""
    for name, content, prompts in [("p.txt", '{"prompt": "Hi"}\r\n{"prompt": "Bye"}\r\n', ["Hi", "Bye"]),
                                   ("p.jsonl", '{"prompt": "Hi"}\n', ["Hi"]),
                                   ("q.txt", "Hi\r\nBye\r\n", ["Hi", "Bye"])]:
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + content.encode())
        assert read_prompts(tmp_path / name) == prompts
    monkeypatch.setattr(sys, "stdin", io.StringIO('\ufeff{"prompt": "p1"}\n'))
    assert read_prompts("-") == ["p1"]


def test_datasets_sources(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"instruction": ["i1", "i2"], "other": ["x", "y"]})
    data.save_to_disk(str(tmp_path / "ds"))
    assert read_prompts(tmp_path / "ds") == ["i1", "i2"]
    datasets.DatasetDict({"train": data}).save_to_disk(str(tmp_path / "dd"))
    assert read_prompts(tmp_path / "dd", field="other") == ["x", "y"]
    data.to_parquet(str(tmp_path / "p.parquet"))
    assert read_prompts(tmp_path / "p.parquet") == ["i1", "i2"]
    data.to_json(str(tmp_path / "p.json"))
    assert read_prompts(tmp_path / "p.json", field="other") == ["x", "y"]
    with pytest.raises(PromptSourceError, match=r"no column 'missing' \(columns: instruction, other\)"):
        read_prompts(tmp_path / "p.parquet", field="missing")
    datasets.DatasetDict({"test": data}).save_to_disk(str(tmp_path / "dt"))
    with pytest.raises(PromptSourceError, match=r"no split 'train' \(splits: test\); name a split's folder: .*dt/test"):
        read_prompts(tmp_path / "dt")
    assert len(read_prompts(tmp_path / "dt" / "test")) == len(data)  # what the refusal names reads
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(PromptSourceError, match="cannot read as a dataset"):
        read_prompts(tmp_path / "bad.parquet")
    (tmp_path / "bad.json").write_text("not json\n")  # was "(An error occurred while generating the dataset)"
    with pytest.raises(PromptSourceError, match=r"bad.json: cannot read as a dataset \(JSON parse error"):
        read_prompts(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "message"),
    [
        ("empty.txt", "", {}, r"empty.txt: no prompts \(the input is empty\)"),
        ("blank.txt", "\n   \n\n", {}, "no prompts"),
        ("empty.jsonl", "\n", {}, "no prompts"),
        ("bad.jsonl", '{"prompt": "ok"}\n\n{"prompt": oops}\n', {}, r"bad.jsonl line 3: invalid JSON"),
        # nested past Python's recursion limit: json.loads' RecursionError was a traceback-type line, exit 1
        ("deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n", {}, r"deep.jsonl line 1: invalid JSON \(nested too deep"),
        ("list.jsonl", '["a"]\n', {}, r"line 1: expected a JSON object, got list"),
        ("nofield.jsonl", '{"prompt": "a"}\n{"body": "b"}\n', {}, r"line 2: no field 'prompt', .* \(fields: body\)"),
        ("named.jsonl", '{"prompt": "a"}\n', {"field": "question"}, r"line 1: no field 'question'"),
        ("number.jsonl", '{"prompt": 3}\n', {}, r"line 1: field 'prompt' is not a non-empty string"),
        ("blankfield.jsonl", '{"text": "  "}\n', {}, r"line 1: field 'text' is not a non-empty string"),
        ("lines.txt", "a prompt\n", {"field": "question"}, r"lines.txt: a field \('question'\) is named, but this "),
    ],
)
def test_bad_sources(tmp_path, name, content, kwargs, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(PromptSourceError, match=message) as info:
        read_prompts(path, **kwargs)
    assert "\n" not in str(info.value)


def test_missing_and_undecodable_files(tmp_path):
    with pytest.raises(PromptSourceError, match="prompt file not found: .*nope.txt"):
        read_prompts(tmp_path / "nope.txt")
    (tmp_path / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(PromptSourceError, match="not UTF-8"):
        read_prompts(tmp_path / "latin.txt")
    assert issubclass(PromptSourceError, ValueError)


# --- prompt records: chat messages, Spec-Bench turns, categories, datasets ----------------------------------------


def test_records_of_every_layout(tmp_path, monkeypatch):
    from specgen.data.prompts import Prompt, read_prompt_records

    rows = [{"prompt": "p", "category": "qa"},
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "category": "chat"},
            {"question_id": 81, "category": "writing", "turns": ["first turn", "second turn"]},  # Spec-Bench's layout
            {"text": "no category"}]
    path = tmp_path / "mixed.txt"  # the content tells JSON Lines, whatever the name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_prompt_records(path) == [
        Prompt("p", "qa"), Prompt(({"role": "system", "content": "s"}, {"role": "user", "content": "u"}), "chat"),
        Prompt("first turn", "writing"), Prompt("no category", "")]
    with pytest.raises(PromptSourceError, match=re.escape(f"{path}: prompt 1 is a chat (`messages`)")):
        read_prompts(path)  # collect-trajectories reads text: which record is not (it was not named)
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"q": "x", "kind": "k"}\n'))
    assert read_prompt_records("-", field="q", category_field="kind") == [Prompt("x", "k")]


def test_dataset_with_named_fields(tmp_path):
    from specgen.data.prompts import Prompt, read_prompt_records

    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"question": ["a", "b"], "topic": ["t1", "t2"]}).save_to_disk(str(tmp_path / "ds"))
    assert read_prompt_records(tmp_path / "ds", field="question", category_field="topic") == [
        Prompt("a", "t1"), Prompt("b", "t2")]
    with pytest.raises(PromptSourceError, match=r"no column 'kind' \(columns: question, topic\)"):
        read_prompt_records(tmp_path / "ds", field="question", category_field="kind")
    (tmp_path / "q.csv").write_text("question,topic\nc,t3\n")
    assert read_prompt_records(tmp_path / "q.csv", field="question", category_field="topic") == [Prompt("c", "t3")]


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "user"}]}, "holds messages without a string 'role' and 'content'"),
    ({"turns": [3]}, "field 'turns' is not a non-empty string, messages or turns"),
    ({"prompt": "a", "category": "c"}, "line 1: no category field 'kind'"),
])
def test_bad_records_are_one_line(tmp_path, row, message):
    from specgen.data.prompts import read_prompt_records

    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(PromptSourceError, match=message) as info:
        read_prompt_records(path, category_field="kind" if "category" in row else None)
    assert "\n" not in str(info.value)


def test_the_shipped_mixed_set():
    from collections import Counter

    from specgen.data.prompts import read_prompt_records
    from specgen.eval.text_bench import MIXED_PROMPTS

    prompts = read_prompt_records(MIXED_PROMPTS)
    counts = Counter(p.category for p in prompts)
    assert len(prompts) >= 30 and len(counts) >= 6 and min(counts.values()) >= 4, counts
    assert {"chat", "summarization", "translation", "qa", "math", "rag", "code"} <= set(counts)
