"""Streaming: the pieces a row streams, joined, are its completion, for every lossless text method; `--stream` prints
valid JSON lines in each row's order."""

from __future__ import annotations

import json

import pytest

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.methods import METHODS, run_batch
from tests.conftest import method_drafter, tiny_model
from tests.text.test_tokenizer import smollm2  # noqa: F401 - the fixture: SmolLM2's tokenizer from its GGUF

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


def streamed(tokenizer, ids: list[int], rng, stops=None) -> str:
    """The pieces a TextStream gives for `ids` arriving in chunks of 1 to 6 tokens (a speculative step's), joined."""
    from specgen.decoding.stops import Stops
    from specgen.generate.text import TextStream

    pieces: list[str] = []
    stream = TextStream(tokenizer, 1, lambda i, text: pieces.append(text), stops or Stops())
    k = 0
    while k < len(ids):
        step = rng.randint(1, 6)
        stream(0, ids[k:k + step])
        k += step
    stream(0, [], final=True)
    return "".join(pieces)


@pytest.mark.parametrize("seed", range(20))
def test_streamed_pieces_join_to_the_whole_text_of_random_bytes_and_specials(seed):
    """Characters split across chunks, specials that decode to nothing, stop strings: the whole text's completion."""
    import random

    from specgen.decoding.stops import Stops
    from tests.decoding.test_stops import random_text_ids, utf8_bytes

    class Bytes:
        decode = staticmethod(utf8_bytes)

    rng = random.Random(seed)
    ids = random_text_ids(rng, 60)
    text = utf8_bytes(ids)
    stops = Stops((), (text[rng.randrange(len(text)):][:3].strip("\ufffd") or "zz",), utf8_bytes) if seed % 2 else None
    want = text[: stops.cut(text)] if stops else text
    assert streamed(Bytes(), ids, rng, stops) == want


def test_streamed_pieces_join_to_the_whole_text_of_smollm2s_random_ids(smollm2):  # noqa: F811
    """SmolLM2's byte-level BPE: byte tokens that split characters, specials, merges of every kind."""
    import random

    tokenizer = smollm2[1]
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.choice([rng.randrange(49152), rng.randrange(300), rng.randrange(49152 - 300, 49152)])
               for _ in range(80)]
        assert streamed(tokenizer, ids, rng) == tokenizer.decode(ids), ids


def test_each_call_decodes_a_window_not_the_whole_text():
    """The cost of a streamed token does not grow with the output: each decode is of the latest chunks only."""
    import random

    from tests.decoding.test_stops import utf8_bytes

    lengths: list[int] = []

    class Counted:
        def decode(self, ids):
            lengths.append(len(ids))
            return utf8_bytes(ids)

    ids = list(("words and more words " * 200).encode())
    assert streamed(Counted(), ids, random.Random(0)) == utf8_bytes(ids)
    assert max(lengths) <= 12  # two chunks of at most 6 tokens
