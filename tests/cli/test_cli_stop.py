"""`generate --stop`: completions cut before the first stop string, streamed or not, from the option or a recipe."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli_stream import PROMPTS, gen, tiny  # noqa: F401 - tiny: the fixture (target/tiny-text)


def rows_of(stdout: str, key: str) -> list[str]:
    """Each row's text from JSON lines: `completion` of results in order, or `text` pieces joined by their row."""
    lines = [json.loads(line) for line in stdout.splitlines()]
    if key == "completion":
        return [line["completion"] for line in lines]
    return ["".join(line["text"] for line in lines if line["row"] == i) for i in range(len(PROMPTS) // 2)]


@pytest.mark.parametrize("method", ["ar", "ngram", "jacobi"])
def test_stop_strings_cut_the_completions_and_the_streamed_pieces_join_to_them(tiny, method):  # noqa: F811
    """A stop string from the first row's own text ends it there (cut before the string), streamed or not."""
    plain = rows_of(gen(method, "--format", "json").stdout, "completion")
    stop = plain[0][3:5]
    r = gen(method, "--format", "json", "--stop", stop, "--stop", "never here")
    assert r.exit_code == 0, r.output
    stopped = rows_of(r.stdout, "completion")
    assert stopped == [p[: p.index(stop)] if stop in p else p for p in plain] and stopped[0] != plain[0]
    streamed = gen(method, "--stream", "--stop", stop, "--stop", "never here")
    assert streamed.exit_code == 0 and rows_of(streamed.stdout, "text") == stopped


def test_a_terminals_live_text_with_stops_is_the_piped_output(tiny, monkeypatch):  # noqa: F811
    from cli import _stream

    plain = rows_of(gen("ar", "--format", "json").stdout, "completion")
    stop = plain[2][4:6]
    piped = gen("ar", "--quiet", "--stop", stop)
    monkeypatch.setattr(_stream, "stdout_is_terminal", lambda: True)
    live = gen("ar", "--stop", stop)
    assert live.exit_code == 0 and live.stdout == piped.stdout and stop not in live.stdout.split("\n\n")[2]


def test_a_recipes_stop_strings_are_the_options(tiny, tmp_path):  # noqa: F811
    """`stop:` in a recipe (a line break among them: control characters are allowed there) as --stop gives them."""
    plain = rows_of(gen("ar", "--format", "json").stdout, "completion")
    recipe = tmp_path / "stops.yaml"
    recipe.write_text(json.dumps({"stop": ["\n", plain[1][2:4]]}))  # JSON is YAML
    by_recipe = gen("ar", "--format", "json", "--config", str(recipe))
    by_option = gen("ar", "--format", "json", "--stop", "\n", "--stop", plain[1][2:4])
    assert by_recipe.exit_code == 0, by_recipe.output
    assert rows_of(by_recipe.stdout, "completion") == rows_of(by_option.stdout, "completion") != plain


def test_generate_help_documents_stop():
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert "--stop" in r.stdout and "[text] Stop string (repeatable; recipe key stop)" in r.stdout
