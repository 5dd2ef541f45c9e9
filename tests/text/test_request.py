"""A generate config parses into one DecodeRequest: the method looked up once, its options typed and checked once."""

from __future__ import annotations

import pytest

from specgen.errors import UsageError
from specgen.generate.image import ImageGenConfig
from specgen.generate.text import TextGenConfig
from specgen.methods import METHODS
from specgen.methods.options import ArOptions, JacobiOptions
from specgen.request import parse_request


def test_the_request_holds_the_spec_and_typed_options():
    req = parse_request(TextGenConfig(method="jacobi", method_options={"block_size": 3, "budget": "auto"}), "text")
    assert req.spec is METHODS["jacobi"] and req.options == JacobiOptions(block_size=3, budget="auto")
    assert req.budget == "auto" and req.builder_options() == {"block_size": 3}
    assert parse_request(TextGenConfig(), "text").options == ArOptions() and req.device == "cpu"


def test_a_spec_given_is_not_looked_up_again():
    req = parse_request(TextGenConfig(method="no-such-method"), "text", METHODS["ngram"])
    assert req.method == "ngram"


@pytest.mark.parametrize("cfg, modality, match", [
    (TextGenConfig(method="adt-tree"), "text", "is for image models, not text"),
    (ImageGenConfig(method="ngram"), "image", "is for text models, not image"),
    (TextGenConfig(method="jacobi", method_options={"block_size": 0}), "text", "option block_size of jacobi"),
    (TextGenConfig(method="ngram", method_options={"blocks": 2}), "text", "has no option 'blocks'"),
])
def test_bad_requests_are_one_usage_error(cfg, modality, match):
    with pytest.raises(UsageError, match=match):
        parse_request(cfg, modality)


def test_with_cfg_keeps_the_parsed_method_and_rebuilds_the_sampler():
    req = parse_request(ImageGenConfig(method="eagle2", method_options={"depth": 2}), "image")
    hot = req.with_cfg(temperature=0.0, seed=7)
    assert hot.spec is req.spec and hot.options is req.options and hot.params.greedy and hot.cfg.seed == 7
