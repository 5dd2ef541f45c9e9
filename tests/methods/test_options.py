"""The method table's option classes: defaults, checks, the parse_options contract, and the defaults the drafters
and builders had before the table held them."""

from dataclasses import MISSING, FrozenInstanceError, fields

import pytest

from specgen.errors import UsageError
from specgen.generate.image_methods import BUILDERS
from specgen.methods import METHODS, get_method
from specgen.methods import options as O


def defaults(cls: type) -> dict:
    """Field name -> default (None = derived when the method is built)."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_has_valid_defaults_and_a_factory(name):
    spec = METHODS[name]
    opts = spec.parse_options({})  # the defaults pass their own checks
    if isinstance(opts, O.Options):
        opts.validate(name)
    assert not spec.runs_on("text") or spec.drafter is not None, f"{name} runs on text without a drafter"
    assert spec.runs_on("image") == (name in BUILDERS), f"{name} runs on images without a builder"
    for f in fields(spec.options_type):
        assert f.metadata.get("check") is not None, f"{name}.{f.name} has no value check"


def test_options_are_frozen():
    with pytest.raises(FrozenInstanceError):
        O.JacobiOptions().block_size = 8


def test_unknown_option_is_one_line_naming_the_known_ones():
    with pytest.raises(UsageError, match=r"^method ngram has no option 'blocks'; its options: num_draft, max_ngram, "
                                         r"min_ngram, cache, candidates, budget, seed$"):
        get_method("ngram").parse_options({"blocks": 2})
    with pytest.raises(UsageError, match="method ar has no option 'depth'; its options: run_ahead, seed$"):
        get_method("ar").parse_options({"depth": 2})


@pytest.mark.parametrize("method, options, message", [
    ("jacobi", {"block_size": 0},
     "block_size must be >= 1 (an integer below 2**31) (option block_size of jacobi), got 0"),
    ("jacobi", {"block_size": "abc"}, "block_size must be >= 1"),
    ("jacobi", {"seed": -1}, "seed must be >= 0"),
    ("ngram", {"num_draft": -3}, "num_draft must be >= 1"),
    ("pcllm-mr", {"spawn_ratio": 0}, "spawn_ratio must be in (0, 1] (a finite number)"),
    ("xspecmesh", {"delta": float("nan")}, "delta must be in [0, 1] (a finite number) (option delta of xspecmesh)"),
    ("xspecmesh", {"vertex_lookup": 1}, "vertex_lookup must be true or false"),
    ("lantern", {"lantern_delta": -0.1}, "lantern_delta must be in [0, 1]"),
    ("vvs", {"refresh": "yes"}, "refresh must be true or false"),
    ("mulo-sd", {"tau": -1}, "tau must be >= 0 (a finite number)"),
    ("adt-tree", {"beta": 0}, "beta must be > 0"),
    # choices and rules between options: refused with the other options, before any model loads
    ("adt-tree", {"init": "diagonal"}, "init must be one of horizontal, vertical, random"),
    # the bounds' rules name the values that break them, and what to set (they named neither)
    ("adt-tree", {"d_min": 3, "d_max": 4}, "adt-tree bounds must leave room to adapt: d_max - d_min >= 2 and "
                                           "k_max - k_min >= 2, got d_min 3, d_max 4, k_min 1, k_max 12"),
    ("adt-tree", {"d0": 12}, "adt-tree's first tree must lie strictly inside the bounds: d0 12 is not in (0, 10) "
                             "(d_min, d_max); set d0, or widen the bounds"),
    ("adt-tree", {"d_max": 2, "k0": 1}, "d0 4 is not in (0, 2) (d_min, d_max), k0 1 is not in (1, 12) (k_min, k_max)"),
    # min_ngram above max_ngram left no n-gram length to look up: n-gram ran as AR, unsaid
    ("ngram", {"min_ngram": 3, "max_ngram": 1}, "ngram's min_ngram (3) must be <= max_ngram (1)"),
    ("adt-tree+lantern", {"lantern_delta": 1.5}, "lantern_delta must be in [0, 1]"),
    ("eagle2", {"budget": "sometimes"}, "budget must be fixed or auto"),
    ("pcllm-mr", {"block_size": 1}, "block_size must be >= 2 (an integer below 2**31) (option block_size of"),
    ("vvs", {"interval": 1}, "interval must be >= 2"),
    ("vvs", {"schedule": "often"}, "schedule must be one of uniform, dynamic, none"),
    ("vvs", {"alpha": 0}, "alpha must be in (0, 1]"),
    ("vvs", {"budget": "auto"}, "budget"),  # VVS's own steps decide what it drafts: no budget option
    ("mulo-sd", {"rejection": "global"}, "rejection must be one of local, raster"),
    ("mulo-sd", {"radius": 65}, "radius must be an integer in 0..64"),
])
def test_bad_value_is_one_line(method, options, message):
    with pytest.raises(UsageError) as e:
        get_method(method).parse_options(options)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_gpu_defaults_pass_their_checks_and_yield_to_given_values(name):
    """On a GPU a field takes its GPU default (`opt(gpu=...)`) unless the run gives it; either way it is checked."""
    spec = METHODS[name]
    gpu = O.gpu_defaults(spec.options_type)
    opts = spec.parse_options({}, gpu=True)
    assert {k: getattr(opts, k) for k in gpu} == gpu
    assert spec.parse_options({}, gpu=False) == spec.options_type()
    for k, v in gpu.items():
        assert v != defaults(spec.options_type)[k], f"{name}.{k}: a GPU default equal to the CPU one"
        assert getattr(spec.parse_options({k: v + 1}, gpu=True), k) == v + 1  # a given value wins
        accepts = next(f for f in fields(spec.options_type) if f.name == k).metadata["check"][0]
        bad = next(x for x in (0, -1, "x") if not accepts(x))  # a value the field's own check refuses
        with pytest.raises(UsageError, match=f"^{k} must be"):
            spec.parse_options({k: bad}, gpu=True)


def test_drafts_are_longer_on_a_gpu():
    """Trees verify 31 nodes on a GPU, 16 on a CPU; n-gram drafts 16 tokens, 4 on a CPU. 31 is the most nodes whose
    CFG verify (two branches, each the root and its nodes) is one product slice, which costs about one step there: one
    node more takes a second slice (c(64) 1.87-1.90 against c(32) 1.00 at the LlamaGen shapes, docs/results/gpu.md)."""
    from specgen.models.sliced_linear import SLICE_ROWS

    assert 2 * (O.GPU_TREE_NODES + 1) == SLICE_ROWS
    for name in ("eagle2", "adt-tree", "lantern", "adt-tree+lantern", "vvs"):
        assert get_method(name).parse_options({}, gpu=True).total_tokens == O.GPU_TREE_NODES == 31
        assert get_method(name).parse_options({}).total_tokens == 16
    for name in ("eagle2", "lantern", "vvs"):  # the fixed shapes' beam: 3 on a GPU (the same width bucket as 4)
        assert (get_method(name).parse_options({}, gpu=True).top_k, get_method(name).parse_options({}).top_k) == (3, 4)
    assert get_method("ngram").parse_options({}, gpu=True).num_draft == O.GPU_DRAFT == 16
    assert get_method("ngram").parse_options({}).num_draft == 4
    assert (get_method("ngram").parse_options({}, gpu=True).min_ngram, get_method("ngram").parse_options({}).min_ngram
            ) == (1, 2)  # unigram matches where a wrong draft is free


def test_a_request_parses_options_for_its_device(monkeypatch):
    from specgen import request
    from specgen.generate.image import ImageGenConfig

    assert request.parse_request(ImageGenConfig(method="eagle2"), "image").options.total_tokens == 16
    monkeypatch.setattr(request, "device_name", lambda spec: "cuda:0")
    cfg = ImageGenConfig(method="eagle2", device="cuda")
    assert request.parse_request(cfg, "image").options.total_tokens == O.GPU_TREE_NODES == 31
    given = ImageGenConfig(method="eagle2", device="cuda", method_options={"total_tokens": 24})
    assert request.parse_request(given, "image").options.total_tokens == 24


def test_an_image_builder_parses_options_for_its_models_device(monkeypatch):
    import torch

    from specgen.generate import image_methods as M

    seen = []
    monkeypatch.setitem(M.BUILDERS, "eagle2", lambda parts, o: seen.append(o.total_tokens) or (None, None))
    parts = M.ImageParts(torch.nn.Linear(2, 2), None, None, None, 4)
    M.build_image_method("eagle2", parts, {})
    monkeypatch.setattr(M, "module_device", lambda module: torch.device("cuda", 0))
    M.build_image_method("eagle2", parts, {})
    M.build_image_method("eagle2", parts, {"total_tokens": 8})
    assert seen == [16, O.GPU_TREE_NODES, 8]


def test_the_text_benchmark_plans_its_rows_for_its_device():
    """A text benchmark's specgen rows take the defaults of the device it names (planned without one: a dry run)."""
    from specgen.eval.text_bench import TextBenchConfig, check_methods

    rows = {d: check_methods(TextBenchConfig(methods=["ar", "ngram"], device=d)) for d in ("cpu", "cuda")}
    assert rows["cpu"]["ngram"].options.num_draft == 4 and rows["cuda"]["ngram"].options.num_draft == 16
