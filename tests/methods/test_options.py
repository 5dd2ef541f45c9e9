"""The method table's option classes: defaults, checks, the check_options contract, and the defaults the drafters
and builders had before the table held them."""

from dataclasses import MISSING, FrozenInstanceError, fields

import pytest

from specgen.errors import UsageError
from specgen.methods import METHODS, get_method
from specgen.methods import options as O
from specgen.methods.options import check_option_values


def defaults(cls: type) -> dict:
    """Field name -> default (None = derived when the method is built)."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_has_valid_defaults_and_a_factory(name):
    spec = METHODS[name]
    opts = spec.parse_options({})  # the defaults pass their own checks
    if isinstance(opts, O.Options):
        opts.validate(name)
    assert spec.drafter is not None or spec.build_image, name
    assert not spec.runs_on("image") or spec.build_image, f"{name} runs on images without a builder"
    for f in fields(spec.options_type):
        assert f.name in O.CHECKS or f.name == "budget", f"{name}.{f.name} has no value check"


def test_options_are_frozen():
    with pytest.raises(FrozenInstanceError):
        O.JacobiOptions().block_size = 8


def test_unknown_option_is_one_line_naming_the_known_ones():
    with pytest.raises(UsageError, match=r"^method ngram has no option 'blocks'; its options: num_draft, max_ngram, "
                                         r"min_ngram, cache, budget$"):
        get_method("ngram").check_options({"blocks": 2})
    with pytest.raises(UsageError, match="method ar has no option 'depth'; its options: none"):
        get_method("ar").check_options({"depth": 2})


@pytest.mark.parametrize("method, options, message", [
    ("jacobi", {"block_size": 0},
     "block_size must be >= 1 (an integer below 2**31) (method_options.block_size of jacobi), got 0"),
    ("jacobi", {"block_size": "abc"}, "block_size must be >= 1"),
    ("jacobi", {"seed": -1}, "seed must be >= 0"),
    ("ngram", {"num_draft": -3}, "num_draft must be >= 1"),
    ("pcllm-mr", {"spawn_ratio": 0}, "spawn_ratio must be in (0, 1] (a finite number)"),
    ("xspecmesh", {"delta": float("nan")}, "delta must be in [0, 1] (a finite number) (method_options.delta of xspecmesh)"),
    ("xspecmesh", {"vertex_lookup": 1}, "vertex_lookup must be true or false"),
    ("lantern", {"lantern_delta": -0.1}, "lantern_delta must be in [0, 1]"),
    ("vvs", {"refresh": "yes"}, "refresh must be true or false"),
    ("mulo-sd", {"tau": -1}, "tau must be >= 0 (a finite number)"),
    ("adt-tree", {"beta": 0}, "beta must be > 0"),
    # choices and rules between options: refused with the other options, before any model loads
    ("adt-tree", {"init": "diagonal"}, "init must be one of horizontal, vertical, random"),
    ("adt-tree", {"d_min": 3, "d_max": 4}, "adt-tree bounds must leave room"),
    ("adt-tree", {"d0": 12}, "adt-tree start shape (12, 4) must lie inside the bounds"),
    ("adt-tree+lantern", {"lantern_delta": 1.5}, "lantern_delta must be in [0, 1]"),
    ("eagle2", {"budget": "sometimes"}, "budget must be fixed or auto"),
    ("pcllm-mr", {"block_size": 1}, "pcllm-mr needs block_size >= 2"),
    ("vvs", {"interval": 1}, "interval must be >= 2"),
    ("vvs", {"schedule": "often"}, "schedule must be one of uniform, dynamic, none"),
    ("vvs", {"alpha": 0}, "alpha must be in (0, 1]"),
    ("vvs", {"budget": "auto"}, "budget"),  # VVS's own steps decide what it drafts: no budget option
    ("mulo-sd", {"rejection": "global"}, "rejection must be one of local, raster"),
    ("mulo-sd", {"radius": 65}, "radius must be an integer in 0..64"),
])
def test_bad_value_is_one_line(method, options, message):
    with pytest.raises(UsageError) as e:
        get_method(method).check_options(options)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_values_of_several_methods_are_checked_by_name():
    check_option_values("ngram", {"num_draft": 2, "budget": "auto", "unknown": object()})
    with pytest.raises(UsageError, match=r"radius must be an integer in 0..64 \(method_options.radius of mulo-sd\)"):
        check_option_values("mulo-sd", {"radius": 1.5})


def test_rules_between_options_run_with_the_check():
    with pytest.raises(UsageError, match="lookup and vertex_lookup are exclusive"):
        get_method("xspecmesh").check_options({"lookup": 2, "vertex_lookup": True})


def test_text_defaults_are_the_drafters():
    from specgen.methods.pcllm import MultiBlockDrafter
    from specgen.methods.text import JacobiDrafter, NgramDrafter

    assert O.JacobiOptions().block_size == JacobiDrafter().block_size == 4
    assert O.CllmOptions().block_size == 16
    ngram = NgramDrafter()
    assert O.NgramOptions() == O.NgramOptions(ngram.num_draft, ngram.max_ngram, ngram.min_ngram)
    mr = MultiBlockDrafter()
    assert {k: v for k, v in O.MultiBlockOptions().as_dict().items() if k != "budget"} == \
        {f.name: getattr(mr, f.name) for f in fields(mr) if f.name != "seed"}
    for name in ("jacobi", "ngram", "cllm", "pcllm", "pcllm-mr"):
        assert defaults(METHODS[name].options_type)["budget"] == "fixed"


def test_make_drafter_reads_the_options_and_ignores_the_rest():
    d = get_method("pcllm-mr").make_drafter({"seed": 3, "block_size": 5, "budget": "auto", "other": 1})
    assert (d.block_size, d.num_blocks, d.seed) == (5, 2, 3)
    assert get_method("cllm").make_drafter({}).block_size == 16
    assert get_method("xspecmesh").make_drafter({"seed": 1, "delta": 0.25}).delta == 0.25


def test_image_defaults_are_the_cpu_defaults_over_the_papers():
    """The tree defaults are the CPU ones the builders got before (SMALL_TREE, SMALL_ADT over AdtParams)."""
    from specgen.methods.adt_tree import AdtParams

    assert (O.TreeOptions().depth, O.TreeOptions().top_k, O.TreeOptions().total_tokens) == (6, 4, 16)
    small_adt = {"total_tokens": 16, "k0": 4, "l_k": 2, "k_min": 1, "k_max": 12}
    paper = {f.name: getattr(AdtParams(), f.name) for f in fields(AdtParams) if f.name not in ("grid", "n_cond")}
    assert defaults(O.AdtOptions) == {**paper, **small_adt, "budget": "fixed"}  # budget: the loop's
    for cls in (O.AdtLanternOptions, O.LanternTreeOptions, O.VvsOptions, O.MuloOptions):
        assert (defaults(cls)["lantern_k"], defaults(cls)["lantern_delta"]) == (0, 0.1)


def test_mulo_and_vvs_defaults_are_their_builders():
    from specgen.methods import mulo_sd

    m = O.MuloOptions()
    assert (m.lowres, m.radius, m.lantern_delta, m.rejection, m.draft_rows) == \
        (mulo_sd.DEFAULT_LOWRES, mulo_sd.DEFAULT_RADIUS, mulo_sd.DEFAULT_DELTA, "local", 1)
    assert m.tau is None and m.upsampler is None and "tau" not in m.as_dict()  # derived when built
    v = O.VvsOptions()
    assert (v.schedule, v.interval, v.threshold, v.alpha, v.stride, v.staleness, v.refresh) == \
        ("uniform", 3, 0.75, 0.8, 2, 0, True)


def test_lossless_flags():
    lossless = {name for name, spec in METHODS.items() if spec.lossless}
    assert lossless == {"ar", "jacobi", "ngram", "cllm", "pcllm", "pcllm-mr", "eagle2", "adt-tree"}
