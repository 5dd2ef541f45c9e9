"""Streaming: the pieces a row streams, joined, are its completion, for every lossless text method; `--stream` prints
valid JSON lines in each row's order."""

from __future__ import annotations

import json

import pytest

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.methods import METHODS, run_batch
from tests.conftest import method_drafter, tiny_model

TEXT_LOSSLESS = [name for name, spec in METHODS.items() if spec.lossless and spec.runs_on("text")
                 and spec.target == "base"]
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7], [3, 1, 4, 1, 5, 9]]


@pytest.mark.parametrize("name", TEXT_LOSSLESS)
def test_streamed_tokens_joined_are_each_rows_result(name):
    """Stop tokens and budgets cut the stream where they cut the result (stop id 5 appears in the outputs)."""
    got: dict[int, list[int]] = {i: [] for i in range(len(PROMPTS))}
    res = run_batch(ModelTarget(tiny_model(0)), lambda i: method_drafter(name), PROMPTS, 20, SamplingParams(),
                    (5,), batch_size=2, on_tokens=lambda i, toks: got[i].extend(toks))
    assert [got[i] for i in range(len(PROMPTS))] == [r.tokens for r in res.results]


def test_text_stream_pieces_join_to_the_decoded_text():
    from specgen.generate.text import TextStream

    class Bytes:  # a tokenizer whose tokens are UTF-8 bytes: a character can span two steps
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    pieces: list[str] = []
    stream = TextStream(Bytes(), 1, lambda i, text: pieces.append(text))
    data = "naïve 😀 end".encode()
    for k in range(0, len(data), 3):
        stream(0, list(data[k:k + 3]))
    stream(0, [], final=True)
    assert "".join(pieces) == "naïve 😀 end" and all("\ufffd" not in p for p in pieces)


@pytest.mark.slow
def test_stream_flag_prints_json_lines_in_row_order():
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["generate", "--method", "ngram", "--prompt", "Sort a list", "--prompt", "Hi",
                                 "--max-new-tokens", "12", "--stream", "--quiet"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines and all(set(line) == {"row", "text"} for line in lines)
    assert {line["row"] for line in lines} <= {0, 1}


def test_text_stream_holds_back_what_may_begin_a_stop_string_until_it_is_known():
    """`<st`, `<sto` come before the stop string `<stop>` without the rest of it: they are held back, then sent;
    the pieces never take back text, and join to the completion (cut before the stop string)."""
    from specgen.decoding.stops import Stops
    from specgen.generate.text import TextStream

    class Bytes:
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    pieces: list[str] = []
    stream = TextStream(Bytes(), 1, lambda i, text: pieces.append(text), Stops((), ("<stop>",), Bytes().decode))
    data, sent = "a <st ré <sto p <stop> tail".encode(), []
    for b in data[: data.index(b">") + 1]:  # the loop's stream ends with the token completing the stop string
        stream(0, [b])
        sent.append("".join(pieces))
    stream(0, [], final=True)
    assert "".join(pieces) == "a <st ré <sto p "
    assert all(later.startswith(earlier) for earlier, later in zip(sent, sent[1:]))
    assert not any(s.endswith(("<", "<s", "<st", "<sto", "<stop")) for s in sent)  # each start held while it may be one
    assert "a <st" in sent[data.index(b" r")] and sent[data.index(b"<sto") + 3] == "a <st ré "
