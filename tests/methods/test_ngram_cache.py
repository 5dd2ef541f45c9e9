"""The static n-gram cache: what it keeps, how it drafts, its file, and that `ngram` with it still equals AR."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from safetensors.torch import save_file

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import ModelTarget
from specgen.errors import CheckpointError, UsageError
from specgen.methods import get_method
from specgen.methods import ngram_cache as C
from specgen.methods.options import NgramOptions
from specgen.methods.text import EmptyDrafter, NgramDrafter
from tests.conftest import decode, tiny_model


def build_table(answers: list[list[int]]) -> dict[tuple[int, ...], int]:
    """The cache's table from token streams, as `save` then `load` build it."""
    return C.table_of(C.joined(answers))


def test_a_continuation_is_kept_only_when_seen_often_and_mostly():
    table = build_table([[1, 2, 3], [1, 2, 3], [1, 2, 4], [5, 6, 7], [8, 9, 1, 8, 9, 2]])
    assert table[(1, 2)] == 3  # 2 of 3 times: count >= MIN_COUNT and share >= MIN_SHARE
    assert (5, 6) not in table  # seen once
    assert (8, 9) not in table  # 1 and 2, once each: neither is the most common often enough
    assert build_table([[1, 2, 3], [1, 2, 4], [1, 2, 5], [1, 2, 3]])[(1, 2)] == 3  # 2 of 4: share 0.5 is enough
    assert (1, 2) not in build_table([[1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 2, 5], [1, 2, 6]])  # 2 of 5


def counted(answers: list[list[int]]) -> dict[tuple[int, ...], int]:
    """The rule written plainly: a Counter per n-gram over the streams in order (its ties go to the first seen)."""
    follow: dict[tuple[int, ...], Counter] = {}
    for seq in answers:
        for n in range(C.MIN_NGRAM, C.MAX_NGRAM + 1):
            for i in range(len(seq) - n):
                follow.setdefault(tuple(seq[i : i + n]), Counter())[seq[i + n]] += 1
    return {key: tok for key, counts in follow.items() for tok, count in counts.most_common(1)
            if count >= C.MIN_COUNT and count >= C.MIN_SHARE * sum(counts.values())}


def test_the_table_is_the_plain_rule_on_random_streams_with_ties():
    rng = random.Random(0)
    for _ in range(200):  # small vocabularies make ties at a share of exactly 0.5; a large one, token ids > 2^15
        vocab = rng.choice([2, 3, 5, 50_000])
        answers = [[rng.randrange(vocab) for _ in range(rng.randrange(40))] for _ in range(rng.randrange(12))]
        assert build_table(answers) == counted(answers)
    assert build_table([[1, 2, 3, 1, 2, 4, 1, 2, 4, 1, 2, 3]])[(1, 2)] == 3  # 2 each: the first seen wins



def test_an_interrupted_cache_build_leaves_the_earlier_file_whole(tmp_path, monkeypatch):
    """`python -m specgen.text.ngram_cache --out F` wrote F in place: a full disk or a kill mid-write left a torn
    shipped asset where the earlier one was; the write is atomic, and its failure the OSError naming F."""
    from specgen import registry

    path = tmp_path / "c.safetensors"
    C.save(path, [[1, 2, 3, 4]], "abc", "earlier")
    before = path.read_bytes()

    def torn(tensors, name, metadata=None):
        open(name, "wb").write(b"\x08\x00")  # a few bytes, then the device is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(registry, "save_file", torn)
    with pytest.raises(OSError, match="No space left"):
        C.save(path, [[5, 6, 7, 8]], "abc", "later")
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]

def test_drafts_follow_the_longest_n_gram_with_an_entry():
    cache = C.NgramCache({(1, 2): 3, (2, 3): 4, (9, 2, 3): 7, (3, 4): 5})
    assert cache.draft([0, 1, 2], 3) == [3, 4, 5]  # (1, 2) -> 3, then (2, 3) -> 4, then (3, 4) -> 5
    assert cache.draft([9, 2, 3], 3) == [7]  # (9, 2, 3) wins over (2, 3); nothing follows (3, 7)
    assert cache.draft([0, 1, 2], 1) == [3]
    assert cache.draft([5, 6], 3) == []


def test_the_drafter_prefers_the_sequence_own_n_grams():
    cache = C.NgramCache({(1, 2): 8, (2, 8): 9})
    drafter, stats = NgramDrafter(NgramOptions(num_draft=2), cache=cache), DecodeStats()
    assert drafter.propose([1, 2, 3, 4, 1, 2], 2, stats).tokens == (3, 4)  # an earlier match in the sequence
    assert drafter.propose([5, 1, 2], 2, stats).tokens == (8, 9)  # none: the cache
    assert drafter.propose([5, 6, 7], 2, stats).tokens == ()  # neither: an AR step


def test_a_cache_file_round_trips_and_is_refused_for_another_tokenizer(tmp_path):
    answers = [[1, 2, 3, 4], [1, 2, 3, 5], [7, 1, 2, 3]]
    path = tmp_path / "c.safetensors"
    C.save(path, answers, "abc", "test answers")
    cache = C.load(str(path))
    assert cache.table == build_table(answers) and cache.table[(1, 2)] == 3
    C.check_tokenizer(str(path), "abc")
    with pytest.raises(UsageError, match="another tokenizer"):
        C.check_tokenizer(str(path), "xyz")
    with pytest.raises(UsageError, match="no n-gram cache"):
        C.load(str(tmp_path / "missing.safetensors"))
    save_file({"tokens": torch.zeros(3, dtype=torch.int32)}, str(tmp_path / "bare.safetensors"))
    with pytest.raises(CheckpointError, match="not an n-gram cache"):
        C.load(str(tmp_path / "bare.safetensors"))
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read"):
        C.load(str(tmp_path / "junk.safetensors"))


def test_the_method_option_checks_the_cache_against_the_target_tokenizer(tmp_path, monkeypatch):
    path = tmp_path / "c.safetensors"
    C.save(path, [[1, 2, 3], [1, 2, 3]], "abc", "test")
    spec = get_method("ngram")
    assert spec.drafter(spec.parse_options({"cache": str(path)}), 0).cache.table == {(1, 2): 3}
    monkeypatch.setattr("specgen.methods.tokenizer_hash", lambda tok: tok)
    spec.model_check(spec.parse_options({"cache": str(path)}), "abc")
    spec.model_check(spec.parse_options({}), "xyz")  # no cache: nothing to check
    with pytest.raises(UsageError, match="another tokenizer"):
        spec.model_check(spec.parse_options({"cache": str(path)}), "xyz")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ngram_with_a_cache_equals_ar_and_drafts_from_it(seed):
    """A cache made of the target's own greedy answers to other prompts: drafts that are often right, outputs that
    are exactly AR's (a cache of noise too)."""
    model = tiny_model(seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [[int(t) for t in torch.randint(0, 64, (8,), generator=g)] for _ in range(6)]

    def run(drafter, prompt):
        return decode(ModelTarget(model), drafter, prompt, 30, SamplingParams())

    answers = [run(EmptyDrafter(), p).tokens for p in prompts[1:]]
    noise = [[int(t) for t in torch.randint(0, 64, (30,), generator=g)] * 2 for _ in range(4)]
    ar = run(EmptyDrafter(), prompts[0])
    for streams in (answers, noise):
        cache = C.NgramCache(build_table(streams))
        out = run(NgramDrafter(NgramOptions(num_draft=4), cache=cache), prompts[0])
        assert out.tokens == ar.tokens
    cache = C.NgramCache(build_table(answers + [ar.tokens]))  # it has seen this answer too
    out = run(NgramDrafter(NgramOptions(num_draft=4), cache=cache), prompts[0])
    assert out.tokens == ar.tokens and out.stats.target_forwards < ar.stats.target_forwards
