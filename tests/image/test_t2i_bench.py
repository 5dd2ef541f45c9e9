"""Image benchmark on text-conditional (t2i) models: caption rows, caption-target NLL, one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from cli.main import app
from specgen.eval.image_bench import target_nll
from specgen.generate.image import load_image_model
from specgen.image.target import CaptionCFGTarget
from tests.image.test_t2i_generate import CAP, GRID, N_COND, caption, runner, t2i_registry  # noqa: F401
from tests.image_fixtures import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)


def bench(out, *args, model="t2i-gpt"):
    return runner.invoke(app, ["benchmark", "--suite", "images", "--model", model, "--format", "json",
                               "out_dir=" + str(out), "classifier=", *args])


def test_benchmark_t2i_rows(t2i_registry):  # noqa: F811
    caps = t2i_registry / "caps.safetensors"  # 2 captions
    r = bench(t2i_registry / "b", "--limit", "3", "methods=[ar,eagle2,adt-tree]", "cfg_scale=3.0",
              f"captions={caps}")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    by = {(x["method"], x["temperature"]): x for x in rows}
    assert set(by) == {(m, t) for m in ("ar", "eagle2", "adt-tree") for t in (0.0, 1.0)}
    assert all(x["images"] == 3 and x["captions"] == [0, 1, 0] and "classes" not in x for x in rows)
    assert by[("eagle2", 0.0)]["exact_match_vs_ar"] == 1.0 and by[("adt-tree", 0.0)]["exact_match_vs_ar"] == 1.0
    assert by[("adt-tree", 0.0)]["nll"] == by[("ar", 0.0)]["nll"] > 0  # same tokens, same caption target
    assert all(x["tau"] >= 1 and x["nll"] > 0 for x in rows)
    assert all("clf_fid" not in x and "class_accuracy" not in x and "not class labels" in x["quality_note"]
               for x in rows)
    assert (t2i_registry / "b" / "adt-tree-T0-grid.png").is_file()


def test_benchmark_c2i_rows_record_classes(t2i_registry):  # noqa: F811
    r = bench(t2i_registry / "c", "--limit", "2", "methods=[ar]", "temperatures=[0.0]", "classes=[2]",
              model="c2i-gpt")
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    assert row["classes"] == [2, 2] and "captions" not in row  # the entry has no class names: ids


def test_target_nll_uses_the_caption_target(t2i_registry):  # noqa: F811
    """The batched teacher-forced NLL equals a token-by-token pass of the caption target (positions n_cond + r,
    padded caption slots hidden), and depends on the caption."""
    im = load_image_model("t2i-gpt", need_drafter=False)
    model = im.model
    cap, other = caption(4, 3), caption(5, 2)
    tokens = torch.randint(0, model.cfg.vocab_size, (GRID * GRID,), generator=torch.Generator().manual_seed(0))
    target = CaptionCFGTarget(model, 3.0, cap)
    cache = target.new_cache(1, N_COND + len(tokens) + 1)
    logits = target.prefill(torch.tensor([target.prompt()]), cache).logits[0, -1]
    nll = []
    for r, t in enumerate(tokens.tolist()):
        nll.append(-float(logits.float().log_softmax(-1)[t]))
        out = target.forward(torch.tensor([[t]]), torch.tensor([[N_COND + r]]), cache, None)
        target.commit(cache, [0])
        logits = out.logits[0, -1]
    got = target_nll(im, 3.0, cap, tokens.tolist())
    assert got == pytest.approx(sum(nll) / len(nll), rel=1e-4)
    assert target_nll(im, 3.0, other, tokens.tolist()) != pytest.approx(got, rel=1e-4)


@pytest.mark.parametrize("make,args,model,needle", [
    (lambda d: None, [], "t2i-gpt", "needs captions=FILE"),
    (lambda d: None, ["classes=[0]"], "t2i-gpt", "not classes="),
    (lambda d: save_file({"features": torch.randn(1, 2, CAP)}, str(d / "x.safetensors")), ["captions=X"],
     "c2i-gpt", "class-conditional"),
    (lambda d: (d / "x.safetensors").write_bytes(b"garbage"), ["captions=X"], "t2i-gpt", "cannot read"),
    (lambda d: None, ["captions=X"], "t2i-gpt", "not found"),
    (lambda d: save_file({"features": torch.randn(1, N_COND + 1, CAP)}, str(d / "x.safetensors")), ["captions=X"],
     "t2i-gpt", "at most 6"),
    (lambda d: save_file({"features": torch.randn(1, 2, CAP + 1)}, str(d / "x.safetensors")), ["captions=X"],
     "t2i-gpt", "17 wide"),
    (lambda d: save_file({"features": torch.randn(1, 2, CAP)}, str(d / "x.safetensors")),
     ["captions=X", "methods=[ar,mulo-sd]"], "t2i-gpt", "mulo-sd supports class-conditional"),
])
def test_bad_benchmark_conditions(t2i_registry, monkeypatch, make, args, model, needle):  # noqa: F811
    """Refused with one line before any image is decoded."""
    def no_decoding(*a, **k):
        raise AssertionError("decoded an image")

    monkeypatch.setattr("specgen.eval.image_bench.generate_images", no_decoding)
    make(t2i_registry)
    out = t2i_registry / "bad"
    args = [a.replace("=X", "=" + str(t2i_registry / "x.safetensors")) for a in args]
    r = bench(out, "--limit", "1", "temperatures=[0.0]", "methods=[ar]", *args, model=model)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists() or not list(out.glob("*.png"))


def test_a_run_folder_over_an_edited_captions_file_is_refused(t2i_registry):  # noqa: F811
    """A t2i run resumed after its captions file changed mixed images of two caption sets under one table (the text
    suite's prompt files are guarded alike): the run folder keeps the file's digest."""
    caps, run = t2i_registry / "caps.safetensors", t2i_registry / "run"
    args = ["--limit", "1", "methods=[ar]", "temperatures=[0.0]", f"captions={caps}", "--run-dir", str(run)]
    assert bench(t2i_registry / "o", *args).exit_code == 0
    assert bench(t2i_registry / "o", *args).exit_code == 0  # the same inputs: resumes (nothing left to do)
    feats = load_file(str(caps))
    save_file({k: v + 1 if v.is_floating_point() else v for k, v in feats.items()}, str(caps))
    r = bench(t2i_registry / "o", *args)
    assert r.exit_code == 2 and "was started on other inputs: captions" in r.output, r.output
