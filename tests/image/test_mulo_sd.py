"""MuLo-SD: local rejection sets, tau extremes (tau > 1 = AR), registry checks, batch independence and the CLI path on
tiny random models (its stored digests: tests/methods/test_digests.py)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from specgen import checkpoints, registry
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stops import Stops
from specgen.image.neighbours import compute_neighbours
from specgen.image.target import CFGTarget
from specgen.methods import run_batch
from specgen.methods import mulo_sd
from specgen.methods.mulo_sd import MuLoSD, expand_rejections, neighbourhood, pooled_mass
from specgen.methods.text import EmptyDrafter
from specgen.models.upsampler import UpDownSampler, UpsamplerConfig
from specgen.models.vq import VQ_CONFIGS, VQModel
from tests.conftest import decode
from tests.image.helpers import tiny_image_gpt

runner = CliRunner()
G, V = 4, 32


# --- neighbourhood expansion (Eqs. 6-7) ------------------------------------------------------------------

def test_neighbourhood_hand_computed():
    # 6-wide grid, block = rows 2..3 (positions 12..23); rejection at (2, 3) = 15 with l = 1:
    # rows 1..3 x cols 2..4, but only u >= t0 = 15 and inside the block
    assert neighbourhood(15, 15, 1, 6, 12, 24) == [15, 16, 20, 21, 22]
    # R_T = {15, 19}: 19 = (3, 1) adds cols 0..2 of rows 2..3 that are >= 15 -> 18, 19, 20
    assert expand_rejections([19, 15], 1, 6, 12, 24) == [15, 16, 18, 19, 20, 21, 22]
    # never before the first rejection: positions 12..14 (same row, left of t0) stay accepted
    assert all(u >= 15 for u in expand_rejections([15, 23], 2, 6, 12, 24))


def test_neighbourhood_borders_and_variants():
    # left border: (2, 0) = 12 with l = 2 clips at column 0 (no wrap to row 1's right end), block bottom
    assert expand_rejections([12], 2, 6, 12, 24) == [12, 13, 14, 18, 19, 20]
    # right border: (2, 5) = 17 clips at column 5
    assert expand_rejections([17], 1, 6, 12, 24) == [17, 22, 23]
    # a later rejection expands upwards into rows after t0 only
    assert expand_rejections([13, 22], 1, 6, 12, 24) == [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
    assert expand_rejections([13, 22], 1, 6, 12, 24) == sorted(set(
        neighbourhood(13, 13, 1, 6, 12, 24) + neighbourhood(22, 13, 1, 6, 12, 24)))
    # l = 0: local verification without expansion; raster: everything from t0 on
    assert expand_rejections([22, 13], 0, 6, 12, 24) == [13, 22]
    assert expand_rejections([22, 13], 3, 6, 12, 24, "raster") == list(range(13, 24))
    assert expand_rejections([], 3, 6, 12, 24) == []
    # top border of the image: block = row 0
    assert expand_rejections([1], 3, 6, 0, 6) == [1, 2, 3, 4]


def test_pooled_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    nbrs = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 1, 0], [2, 1, 0]])
    # draft 0: own 0.5; neighbours 1, 2, 3 cumulative 0.3, 0.45, 0.5 -> largest <= delta 0.46 is 0.45
    assert float(pooled_mass(probs, torch.tensor([0]), nbrs, 0.46)) == pytest.approx(0.95)
    assert float(pooled_mass(probs, torch.tensor([0]), nbrs, 0.1)) == pytest.approx(0.5)
    # draft 3: own 0.05 + neighbour 2 (0.15) <= 0.2
    assert float(pooled_mass(probs, torch.tensor([3]), nbrs, 0.2)) == pytest.approx(0.2)


# --- the decoder on tiny random models -------------------------------------------------------------------

def tiny_parts(seed: int = 0):
    torch.manual_seed(seed)
    codebook = torch.randn(V, 8)
    target = tiny_image_gpt(0, grid=G, vocab=V, classes=3)
    lowres = tiny_image_gpt(3, grid=G // 2, vocab=V, classes=3)
    torch.manual_seed(seed + 1)
    pair = UpDownSampler(UpsamplerConfig(codebook_size=V, embed_dim=8, scale=2, channels=8, blocks=1)).eval()
    pair.codebook.copy_(codebook)
    return target, lowres, pair, codebook


def mulo(tau, **kw):
    target, lowres, pair, codebook = tiny_parts()
    dec = MuLoSD(lowres, pair, compute_neighbours(codebook, 4), G, tau=tau, **kw)
    return CFGTarget(target, 4.0), dec


def run(target, dec, labels, params, seeds, batch_size=1, stop_ids=()):
    """Images of `labels` on the shared loop, `batch_size` at a time; the rows after the first run on copies of
    `dec` (same parts)."""
    res = run_batch(target, lambda i: dec if i == 0 else copy.copy(dec), [[c] for c in labels], G * G, params,
                    stop_ids, [torch.Generator().manual_seed(s) for s in seeds], batch_size, max_draft=32)
    return res.results


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("rejection,radius", [("local", 3), ("local", 0), ("raster", 3)])
def test_tau_above_one_is_target_sampling(temperature, rejection, radius):
    target, dec = mulo(1.5, rejection=rejection, radius=radius)
    params = SamplingParams(temperature)
    for label in range(2):
        got = run(target, dec, [label], params, [11 + label])[0]
        ref = decode(target, EmptyDrafter(), [label], G * G, params,
                     generator=torch.Generator().manual_seed(11 + label))
        assert got.tokens == ref.tokens
        assert got.stats.extras["resampled_tokens"] == G * G and sum(got.stats.accepted) == 0


@pytest.fixture
def trace(monkeypatch):
    """Each block's rejection set R_T and re-sampled set R_X, as mulo-sd expands its rejections."""
    steps = []

    def expand(rejected, radius, width, start, end, mode):
        resampled = expand_rejections(rejected, radius, width, start, end, mode)
        steps.append({"rejected": rejected, "resampled": resampled, "radius": radius, "width": width, "mode": mode})
        return resampled

    monkeypatch.setattr(mulo_sd, "expand_rejections", expand)
    return steps


def test_tau_zero_rejects_nothing(trace):
    target, dec = mulo(0.0)
    res = run(target, dec, [1], SamplingParams(1.0), [0])[0]
    s = res.stats
    assert s.extras["rejected_tokens"] == 0 and s.extras["resampled_tokens"] == 0
    assert s.target_forwards == 1 + s.steps and s.steps == 2  # 2 low-res rows -> 2 blocks of 8 tokens
    assert sum(s.accepted) == G * G and len(res.tokens) == G * G
    # the output is the up-sampled draft: U_r of the full low-res grid, whose rows are D_r of the
    # accepted prefix followed by the drafted rows
    assert [t["rejected"] for t in trace] == [[], []]


def test_intermediate_tau_resamples_expanded_sets(trace):
    target, dec = mulo(0.05, radius=1)
    res = run(target, dec, [2], SamplingParams(1.0), [5])[0]
    assert len(res.tokens) == G * G
    assert trace and all((t["radius"], t["width"], t["mode"]) == (1, G, "local") for t in trace)
    extras = res.stats.extras
    assert extras["rejected_tokens"] == sum(len(t["rejected"]) for t in trace)
    assert extras["resampled_tokens"] == sum(len(t["resampled"]) for t in trace)
    # one forward per re-sampled token except the first of each step
    assert extras["resample_forwards"] == sum(max(0, len(t["resampled"]) - 1) for t in trace)


# --- registry / CLI --------------------------------------------------------------------------------------

@pytest.fixture
def mulo_registry(tmp_path, registered):
    registered(register_mulo)
    return tmp_path


def register_mulo():
    torch.manual_seed(0)
    vq_cfg = VQ_CONFIGS["vq-tiny"]
    vq = VQModel(vq_cfg)
    registry.save("vq", "m-vq", vq.state_dict(), {"builder": "vq", "kwargs": vq_cfg.to_dict()})
    codes = vq_cfg.codebook_size
    gpt = tiny_image_gpt(0, grid=G, vocab=codes, classes=3)
    meta = {"builder": "transformer", "modality": "image", "vq": "vq/m-vq", "classes": ["a", "b", "c"],
            "vocab_size": codes}
    registry.save("target", "m-gpt", gpt.state_dict(), {**meta, "kwargs": gpt.cfg.to_dict(), "grid": G})
    low = tiny_image_gpt(1, grid=G // 2, vocab=codes, classes=3)
    registry.save("target", "m-low", low.state_dict(), {**meta, "kwargs": low.cfg.to_dict(), "grid": G // 2})
    for scale in (2, 4):
        cfg = UpsamplerConfig(codebook_size=codes, embed_dim=8, scale=scale, channels=8, blocks=1)
        pair = UpDownSampler(cfg)
        pair.codebook.copy_(vq.quantize.embedding.weight)
        registry.save("upsampler", f"m-up{scale}", pair.state_dict(),
                      {"builder": "mulo-updown", "kwargs": cfg.to_dict(), "scale": scale, "vq": "vq/m-vq",
                       "modality": "image"})  # as train-upsampler records
    # a drafter on another codebook (same size, other weights)
    vq2 = VQModel(vq_cfg)
    registry.save("vq", "m-vq2", vq2.state_dict(), {"builder": "vq", "kwargs": vq_cfg.to_dict()})
    registry.save("target", "m-low2", low.state_dict(), {**meta, "vq": "vq/m-vq2", "kwargs": low.cfg.to_dict(),
                                                         "grid": G // 2})


def gen(out, *args):
    return runner.invoke(app, ["generate", "--model", "m-gpt", "--method", "mulo-sd", "--num", "2", "-o", str(out),
                               "method_options.lowres=m-low", *args])


def test_generate_mulo_sd(mulo_registry):
    r = gen(mulo_registry / "ok", "--format", "json", "method_options.upsampler=m-up2", "--seed", "3")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert all(len(i["tokens"]) == G * G for i in doc["images"])
    # tau > 1 equals ar with the same seed
    hi = json.loads(gen(mulo_registry / "hi", "--format", "json", "method_options.upsampler=m-up2", "--seed", "3",
                        "method_options.tau=1.5").stdout)
    ar = runner.invoke(app, ["generate", "--model", "m-gpt", "--method", "ar", "--num", "2", "--seed", "3",
                             "-o", str(mulo_registry / "ar"), "--format", "json"])
    assert [i["tokens"] for i in hi["images"]] == [i["tokens"] for i in json.loads(ar.stdout)["images"]]


@pytest.mark.parametrize("args,needle", [
    (["method_options.upsampler=m-up2", "method_options.lowres=m-low2"], "another VQ codebook"),
    (["method_options.upsampler=m-up4"], "is for 4x"),
    (["method_options.upsampler=m-up2", "method_options.tau=-1"], "tau must be >= 0"),
    (["method_options.upsampler=m-up2", "method_options.radius=-1"], "radius must be an integer in 0..64"),
    (["method_options.upsampler=m-up2", "method_options.radius=100"], "radius must be an integer in 0..64"),
    (["method_options.upsampler=m-up2", "method_options.rejection=spiral"], "rejection must be"),
    (["method_options.upsampler=m-gpt"], "not a MuLo-SD"),
    # an image entry but no GPT: was "AttributeError: 'UpsamplerConfig' object has no attribute 'rope_grid'"
    (["method_options.upsampler=m-up2", "method_options.lowres=m-up2"], "m-up2 is not an image GPT (a target entry)"),
    (["method_options.upsampler=m-up2", "method_options.depth=3"], "has no option"),
])
def test_bad_mulo_input(mulo_registry, args, needle):
    r = gen(mulo_registry / "bad", *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bench_rows_ablations_and_tau_sweep(mulo_registry, tmp_path):
    from specgen.eval.image_bench import ImageBenchConfig, checked_rows, image_rows_of, measure_images, write_outputs
    from specgen.eval.run_dir import RunDir
    from specgen.generate.image import load_image_model

    cfg = ImageBenchConfig(methods=["ar", "mulo-sd"], model="m-gpt", num=1, temperatures=[1.0], quality=False,
                           mulo_ablations=True, sweep={"mulo-sd": {"tau": [0.0, 2.0]}},
                           method_options={"mulo-sd": {"lowres": "m-low", "upsampler": "m-up2"}})
    full = checked_rows(cfg)
    assert full.methods == ["ar", "mulo-sd", "mulo-sd@raster", "mulo-sd@no-expand", "mulo-sd@tau=0", "mulo-sd@tau=2"]
    assert full.options["mulo-sd@no-expand"] == {"radius": 0}
    im = load_image_model("m-gpt", need_drafter=False)
    sink = RunDir.open(tmp_path / "run", "images", {})
    measure_images(im, full, sink)
    rows, pixels = image_rows_of(full, sink)
    by = {r["method"]: r for r in rows}
    assert set(by) == set(full.methods) and not by["mulo-sd"]["lossless"]
    assert by["mulo-sd@tau=0"]["accept_rate"] == 1.0 and by["mulo-sd@tau=0"]["resampled_share"] == 0.0
    assert by["mulo-sd@tau=2"]["exact_match_vs_ar"] == 1.0 and by["mulo-sd@tau=2"]["resampled_share"] == 1.0
    files = write_outputs(rows, pixels, tmp_path / "bench")
    assert any(f.name == "mulo-sd-pareto-T1.png" for f in files)


def test_shipped_mulo_sd_parts_fit():
    from specgen.generate.image import ImageGenConfig, generate_images, load_image_model
    from specgen.request import parse_request

    low, up = checkpoints.find("tiny-image-gpt-lowres"), checkpoints.find("tiny-image-upsampler-2x")
    assert low.meta["grid"] == 8 and low.meta["vq"] == up.meta["vq"] == "tiny-image-vq" and up.meta["scale"] == 2
    im = load_image_model("tiny-image-gpt", need_drafter=False)
    samples, px = generate_images(im, parse_request(ImageGenConfig(method="mulo-sd", num=1, seed=0), "image"))
    assert len(samples[0].tokens) == 256 and px.shape == (1, 3, 64, 64)


def test_defaults_scaled_to_the_codebook(mulo_registry):
    from specgen.generate.image import load_image_model
    from specgen.generate.image_methods import build_image_method

    parts = load_image_model("m-gpt", need_drafter=False).parts(4.0)
    dec, rule = build_image_method("mulo-sd", parts, {"lowres": "m-low", "upsampler": "m-up2"})
    assert rule is None and dec.radius == 3 and dec.delta == 0.1 and dec.rejection == "local"
    assert dec.tau == pytest.approx(1e-4 * 16384 / 512) and dec.neighbours.shape == (512, 31)  # k = 1000 * 512 / 16384
    dec, _ = build_image_method("mulo-sd", parts, {"lowres": "m-low", "upsampler": "m-up2", "tau": 0.5})
    assert dec.tau == 0.5


# --- the batched path: a row's output and counters do not depend on its batch ------------------------------

def counters(stats):
    drop = ("wall_s", "tokens_per_s", "drafter_share", "latency_s")
    return {k: v for k, v in stats.summary().items() if not k.startswith("time_") and k not in drop}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("tau,radius,rejection", [(0.05, 1, "local"), (0.2, 3, "local"), (0.1, 3, "raster"),
                                                  (1.5, 3, "local")])
@pytest.mark.parametrize("stop_ids", [(), (5,)])  # (5,): ragged stopping
def test_batched_mulo_equals_each_row_alone(temperature, tau, radius, rejection, stop_ids):
    """Each row of the batched loop (batch 3, 5 prompts, a seed each) equals the row decoded alone, and stop ids
    only truncate (an image is decoded in whole blocks)."""
    target, dec = mulo(tau, radius=radius, rejection=rejection)
    labels, params = [0, 2, 1, 1, 0], SamplingParams(temperature)
    seeds = [10 + i for i in range(len(labels))]
    alone = [run(target, dec, [c], params, [s])[0] for c, s in zip(labels, seeds)]
    res = run(target, dec, labels, params, seeds, 3, stop_ids)
    assert [r.tokens for r in res] == [r.tokens[: Stops(stop_ids).end(r.tokens, 0, G * G) or G * G] for r in alone]
    if not stop_ids:
        assert [counters(r.stats) for r in res] == [counters(r.stats) for r in alone]
