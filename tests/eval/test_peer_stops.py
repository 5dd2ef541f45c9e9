"""Peer rows end where specgen's rows end (eval/hf_rows.py, eval/llamacpp_row.py): a stop string completed across
tokens or within one, a multi-token step's tokens past it dropped, the prompt's text never matched."""

from __future__ import annotations

import pytest

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stops import Stops
from specgen.decoding.target import ModelTarget
from specgen.eval import hf_rows
from specgen.eval.hf_rows import generate_padded, one_token, timed_static_greedy
from specgen.eval.llamacpp_row import taken
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.models.hf_export import to_hf
from tests.conftest import tiny_model

PROMPT, OTHER = [1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8]
WORDS = [f"{chr(97 + i % 26)}{i}" for i in range(64)]  # each token two or three characters: "a0", ..., "l63"
N = 30


def spelled(ids: list[int]) -> str:
    return "".join(WORDS[i] for i in ids)


def ar(model, prompt: list[int], stops: Stops = Stops()) -> list[int]:
    """specgen's AR row: its tokens through the first stop."""
    return run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [prompt], N, SamplingParams(),
                     stops).results[0].tokens


def first_stop(out: list[int], strings: tuple[str, ...]) -> int:
    """The rule by brute force: the first k whose whole text holds a stop string."""
    return next(k for k in range(1, len(out) + 1) if any(s in spelled(out[:k]) for s in strings))


def cases(out: list[int]) -> dict[str, tuple[str, ...]]:
    """Stop strings from the AR text `out`: one across two tokens, ending inside the second; one inside a token."""
    across = WORDS[out[3]][-1] + WORDS[out[4]][0]  # the last digit of one token and the letter of the next
    inside = WORDS[out[5]][:2] if len(WORDS[out[5]]) == 3 else WORDS[out[5]][1:]  # part of one token's text
    return {"across tokens": (across,), "inside a token": (inside, "never here")}


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


@pytest.mark.parametrize("case", ["across tokens", "inside a token"])
def test_every_hf_row_keeps_the_tokens_specgens_ar_row_keeps(model, case):
    plain = ar(model, PROMPT)
    strings = cases(plain)[case]
    stops = Stops((), strings, spelled)
    k = first_stop(plain, strings)
    kept = ar(model, PROMPT, stops)
    assert kept == plain[:k] and k < N  # the rule the loop follows, and the row ended early
    if case == "across tokens":  # completed by the k-th token, which holds more text than the string's end
        assert strings[0] not in WORDS[plain[k - 1]] and not spelled(plain[:k]).endswith(strings[0])
    hf = to_hf(model).eval()
    assert generate_padded(hf, [PROMPT], N, stops)[0] == [kept]
    assert generate_padded(hf, [PROMPT], N, stops, prompt_lookup_num_tokens=10)[0] == [kept]
    assert timed_static_greedy(hf, one_token, PROMPT, N, stops)[0] == kept
    # a batch of padded prompts: each row ends at its own stop
    assert generate_padded(hf, [PROMPT, OTHER], N, stops)[0] == [kept, ar(model, OTHER, stops)]


def test_a_stop_string_in_the_prompts_text_alone_ends_no_row(model):
    """The rows decode only their generated tokens (transformers' stop_strings matched into the prompt)."""
    plain = ar(model, PROMPT)
    string = spelled(PROMPT[1:3])
    assert string not in spelled(plain)
    stops = Stops((), (string,), spelled)
    hf = to_hf(model).eval()
    assert generate_padded(hf, [PROMPT], N, stops)[0] == [plain] and ar(model, PROMPT, stops) == plain
    assert timed_static_greedy(hf, one_token, PROMPT, N, stops)[0] == plain


def test_prompt_lookup_drops_what_a_step_accepted_past_the_stop(model, monkeypatch):
    """A multi-token lookup step that completes a stop string mid-step: its tokens past it are not kept, and the
    row ends at that step (no forward after it), as specgen's rows end."""
    prompt = [4, 5, 6, 4, 5, 6, 4, 5, 6, 4, 5]
    plain = ar(model, prompt)
    k = 12
    stops = Stops((), (spelled(plain[k - 4 : k]),), spelled)  # a run of one repeated token: lookup accepts many
    kept = ar(model, prompt, stops)
    assert kept == plain[:k]
    seen = []  # the generated length at each call of the criterion

    class Seen(hf_rows.StopCheck):
        def __call__(self, input_ids, scores=None, **kwargs):
            seen.append(input_ids.shape[1] - self.width)
            return super().__call__(input_ids, scores, **kwargs)

    monkeypatch.setattr(hf_rows, "StopCheck", Seen)
    got, forwards, _ = generate_padded(to_hf(model).eval(), [prompt], N, stops, prompt_lookup_num_tokens=10)
    assert got == [kept] and seen[-1] > k and seen[-2] < k  # the last step ran past the stop; it was the last
    assert forwards == len(seen)


def test_stop_ids_end_the_hf_rows_as_specgens():
    model = tiny_model(0)
    plain = ar(model, PROMPT)
    stops = Stops((plain[6],))
    kept = ar(model, PROMPT, stops)
    assert kept == plain[: plain.index(plain[6]) + 1]
    hf = to_hf(model).eval()
    assert generate_padded(hf, [PROMPT], N, stops)[0] == [kept]
    assert generate_padded(hf, [PROMPT], N, stops, prompt_lookup_num_tokens=10)[0] == [kept]
    assert timed_static_greedy(hf, one_token, PROMPT, N, stops)[0] == kept


def test_llamacpp_takes_each_token_as_it_comes_and_stops_there():
    """llama.cpp's stream is read to the token that completes a stop string (kept, as specgen keeps it) and no
    further; a stop id ends it kept, as specgen's rows keep it; the budget caps it."""
    out = [5, 33, 17, 8, 33, 40, 2, 9, 11]
    strings = (WORDS[17][-1] + WORDS[8][0],)  # across tokens 17 and 8
    pulled = []

    def stream(ids):
        for t in ids:
            pulled.append(t)
            yield t

    stops = Stops((63,), strings, spelled)
    assert taken(stream(out), stops, N) == stops.kept(out, N) == out[:4] and pulled == out[:4]
    assert taken(iter([5, 6, 63, 7]), stops, N) == stops.kept([5, 6, 63, 7], N) == [5, 6, 63]
    assert taken(iter(out), Stops(), 3) == out[:3]
