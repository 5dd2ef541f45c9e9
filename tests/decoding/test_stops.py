"""Stop strings (decoding/stops.py): the tail window finds what a search of the whole text finds, at a bounded cost;
every lossless text method with stop strings gives AR's tokens and text with them, alone and batched."""

from __future__ import annotations

import random

import pytest

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stops import Stops
from specgen.decoding.target import ModelTarget
from specgen.methods import run_batch
from tests.conftest import LOSSLESS_TEXT, method_drafter, tiny_model
from tests.decoding.test_batched import ragged_prompts
from tests.text.test_tokenizer import smollm2  # noqa: F401 - the fixture: SmolLM2's tokenizer from its GGUF

GREEDY = SamplingParams()


def utf8_bytes(ids: list[int]) -> str:
    """Byte-level decoding as SmolLM2's: ids < 256 are bytes (a partial character is U+FFFD until it completes),
    ids >= 256 special tokens decoded to nothing."""
    return bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")


def whole_text_end(stops: Stops, out: list[int]) -> int | None:
    """The rule by brute force: the first k whose whole text `decode(out[:k])` holds a stop string, or a stop id."""
    return next((k for k in range(1, len(out) + 1)
                 if out[k - 1] in stops.ids or stops.found(stops.decode(out[:k]))), None)


def chunked_end(stops: Stops, out: list[int], rng: random.Random, limit: int) -> int | None:
    """As the loop looks: chunks of 1 to 6 tokens at a time (a speculative step's), each looked at once."""
    checked = 0
    while checked < len(out):
        step = min(len(out), checked + rng.randint(1, 6))
        found = stops.end(out[:step], checked, limit)
        if found is not None:
            return found
        checked = step
    return None


def random_text_ids(rng: random.Random, n: int) -> list[int]:
    """Token ids of mixed text: ASCII, 2- to 4-byte characters split anywhere, a few specials."""
    text = "".join(rng.choice(["a", "b", " ", "\n", "é", "€", "😀", "ab", "a€"]) for _ in range(n))
    ids = list(text.encode())
    for _ in range(n // 8):
        ids.insert(rng.randrange(len(ids) + 1), 256 + rng.randrange(4))
    return ids


@pytest.mark.parametrize("seed", range(40))
def test_the_tail_window_finds_what_the_whole_text_search_finds(seed):
    rng = random.Random(seed)
    out = random_text_ids(rng, 40)
    text = utf8_bytes(out if seed % 2 else random_text_ids(rng, 40))  # odd seeds: strings of another text (some absent)
    picks = [text[i:i + rng.randint(1, 4)] for i in (rng.randrange(len(text)) for _ in range(rng.randint(1, 3)))]
    strings = tuple(s for s in picks if "\ufffd" not in s) or ("zz",)
    ids = (257,) if seed % 3 == 0 else ()
    stops = Stops(ids, strings, utf8_bytes)
    want = whole_text_end(stops, out)
    assert chunked_end(stops, out, rng, len(out)) == want
    if want is not None:  # the text is cut before the first stop string of the kept tokens' text
        kept = utf8_bytes(out[:want])
        cut = stops.cut(kept)
        assert not any(s in kept[:cut] for s in strings)


@pytest.mark.parametrize("seed", range(3))
def test_the_tail_window_finds_what_the_whole_text_search_finds_in_smollm2s_text(seed, smollm2):  # noqa: F811
    """Random ids of SmolLM2's byte-level BPE (byte tokens that split characters, specials that decode to nothing),
    stop strings drawn from their text and from another's."""
    tokenizer = smollm2[1]
    rng = random.Random(seed)
    bytes_and_specials = [*range(17), *range(49152 - 300, 49152)]  # its specials, then merges of many kinds
    for _ in range(20):
        out = [rng.choice([rng.randrange(49152), rng.choice(bytes_and_specials), rng.randrange(17, 300)])
               for _ in range(30)]
        text = tokenizer.decode(out if rng.random() < 0.7 else [rng.randrange(49152) for _ in range(30)])
        strings = tuple(s for s in (text[i:i + rng.randint(1, 6)] for i in range(0, len(text), 17)) if s.strip()
                        and "\ufffd" not in s) or ("zz",)
        stops = Stops((0,) if rng.random() < 0.3 else (), strings, tokenizer.decode)
        assert chunked_end(stops, out, rng, len(out)) == whole_text_end(stops, out), (out, strings)


def test_the_window_finds_strings_across_specials_and_split_characters():
    stops = Stops((), ("€ b",), utf8_bytes)
    out = list("xx".encode()) + [256] * 30 + list("€".encode()) + [257] + list(" b".encode())
    assert whole_text_end(stops, out) == len(out)
    for chunk in range(1, 5):
        rng = random.Random(chunk)
        assert chunked_end(stops, out, rng, len(out)) == len(out)


def test_each_step_decodes_a_window_not_the_whole_text():
    """Looking at each new token decodes a bounded tail: the cost per token does not grow with the output."""
    lengths: list[int] = []

    def counted(ids):
        lengths.append(len(ids))
        return utf8_bytes(ids)

    stops = Stops((), ("STOP", "never"), counted)
    out = list(("words and more words " * 100).encode()) + list(b"STOP")
    for checked in range(len(out)):
        found = stops.end(out[:checked + 1], checked, len(out))
        assert found is None or (found == len(out) and checked == len(out) - 1)
    assert max(lengths) <= 2 * stops.reach + 1 and found == len(out)


def test_a_budget_cuts_before_a_later_stop():
    stops = Stops((9,), ("c",), lambda ids: "".join("abcd"[t % 4] for t in ids))
    assert stops.end([0, 1, 2, 9], 0, 2) is None  # "c" at the 3rd token and 9 at the 4th: past the budget of 2
    assert stops.end([0, 1, 2, 9], 0, 4) == 3  # the string's token, before the stop id
    assert stops.end([0, 9, 2], 0, 4) == 2


def test_pending_is_the_longest_stop_start_the_text_ends_with():
    stops = Stops((), ("abc", "bd"), str)
    assert [stops.pending(t) for t in ("xab", "xa", "xb", "xabc", "x", "")] == [2, 1, 1, 0, 0, 0]
    assert stops.cut("xxbdab abc") == 2 and stops.cut("none") == 4


def test_empty_strings_and_strings_without_a_decode_are_refused():
    with pytest.raises(ValueError):
        Stops((), ("",), str)
    with pytest.raises(ValueError):
        Stops((), ("x",))


# the tiny targets' 64 ids as text: some tokens of several characters, some of none (a special one)
PIECES = {t: "" if t % 13 == 0 else "abcdefgh ,\n"[t % 11] * (1 + t % 3) for t in range(64)}


def tiny_decode(ids: list[int]) -> str:
    return "".join(PIECES[t] for t in ids)


def completion(stops: Stops, tokens: list[int]) -> str:
    """The text a completion shows (generate_text's): cut before its first stop string."""
    text = tiny_decode(tokens)
    return text[: stops.cut(text)]


@pytest.fixture(scope="module")
def ar_with_stops():
    """A target, 8 ragged prompts, stop strings from AR's own texts (each row's from its middle, so rows end at
    different steps), and AR's tokens with and without them."""
    target, prompts, n = ModelTarget(tiny_model(7)), ragged_prompts(8), 24
    plain = [r.tokens for r in run_batch(target, lambda i: method_drafter("ar"), prompts, n, GREEDY).results]
    texts = [tiny_decode(t) for t in plain]
    rng = random.Random(0)
    strings = tuple(dict.fromkeys(t[k:k + 3] for t in texts[::2] if len(t) > 8 for k in [rng.randrange(2, len(t) - 3)]))
    stops = Stops((), strings, tiny_decode)
    alone = [run_batch(target, lambda i: method_drafter("ar"), [p], n, GREEDY, stops).results[0].tokens
             for p in prompts]
    return target, prompts, n, stops, plain, alone


def test_ar_with_stops_is_the_rule_over_its_plain_output(ar_with_stops):
    """Each row keeps its tokens through the first whose text completes a stop string; the stops fire, in rows
    that end at different steps."""
    target, prompts, n, stops, plain, alone = ar_with_stops
    assert alone == [p[: whole_text_end(stops, p) or len(p)] for p in plain]
    assert sum(a != p for a, p in zip(alone, plain)) >= 3 and len({len(a) for a in alone}) >= 3


@pytest.mark.parametrize("method", LOSSLESS_TEXT)
def test_every_lossless_method_with_stops_equals_ar_with_them(method, ar_with_stops):
    """Token for token and text for text, alone and at batch sizes with refills (8 prompts through 3 slots); a stop
    string that never occurs changes nothing."""
    target, prompts, n, stops, plain, alone = ar_with_stops
    for batch_size in (1, 3, 8):
        res = run_batch(target, lambda i: method_drafter(method), prompts, n, GREEDY, stops, batch_size=batch_size)
        got = [r.tokens for r in res.results]
        assert got == alone, batch_size
        assert [completion(stops, t) for t in got] == [completion(stops, t) for t in alone]
        assert all(r.stats.new_tokens == len(r.tokens) for r in res.results)
    never = Stops((), ("#",), tiny_decode)  # no token decodes to it
    res = run_batch(target, lambda i: method_drafter(method), prompts, n, GREEDY, never, batch_size=3)
    assert [r.tokens for r in res.results] == plain
