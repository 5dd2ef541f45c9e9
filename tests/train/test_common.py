"""The training toolkit shared by every trainer: schedule, AdamW step, atomic files, train state, recipes, scripts."""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from specgen.builtins import ASSETS
from specgen.config import RECIPE_RELATIVE, load_config
from specgen.errors import CheckpointError, UsageError
from specgen.paths import atomic_write
from specgen.tensor_files import cached_tensors
from specgen.train.checkpoint import StaleStateError, check_outputs, fp16_state, write_entry
from specgen.train.classifier import vq_reconstructions
from specgen.train.image_gpt import load_vq, vq_entry
from specgen.train.loop import At, Loop, LoopOptions, Optim, StateFile, TrainTask
from specgen.train.optim import OptimConfig, cosine_lr
from specgen.train.script import parse_recipe, print_metrics, script_parser

ROOT = Path(__file__).resolve().parents[2]


def test_cosine_lr_warms_up_then_decays_to_min_lr():
    lr, low = 1e-3, 1e-4
    assert cosine_lr(0, 100, lr, low, warmup=10) == pytest.approx(lr / 10)
    assert cosine_lr(9, 100, lr, low, warmup=10) == pytest.approx(lr)  # last warmup step reaches lr
    assert cosine_lr(10, 100, lr, low, warmup=10) == pytest.approx(lr)  # cosine starts at lr
    assert cosine_lr(55, 100, lr, low, warmup=10) == pytest.approx((lr + low) / 2)  # half way
    assert cosine_lr(100, 100, lr, low, warmup=10) == pytest.approx(low)
    assert cosine_lr(150, 100, lr, low, warmup=10) == pytest.approx(low)  # flat after the end
    assert cosine_lr(0, 100, lr, low) == lr  # no warmup
    lrs = [cosine_lr(s, 100, lr, low, 10) for s in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_optim_config_builds_adamw_and_schedule():
    cfg = OptimConfig(lr=2e-3, min_lr=0.0, warmup_steps=4, beta1=0.8, beta2=0.9, weight_decay=0.1)
    opt = cfg.adamw([torch.nn.Parameter(torch.zeros(2))])
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (2e-3, (0.8, 0.9), 0.1)
    assert cfg.lr_at(7, 20) == cosine_lr(7, 20, 2e-3, 0.0, 4)


class OneStep(TrainTask):
    """loss = 10 * sum(w) with SGD: every gradient entry is 10, its global norm 10 * sqrt(3)."""

    def __init__(self, clip: float) -> None:
        self.w = torch.nn.Parameter(torch.ones(3))
        self.modules = {"w": torch.nn.ParameterList([self.w])}
        self.optims = {"optim": Optim(torch.optim.SGD([self.w], lr=123.0), lambda s: 0.5, clip)}

    def batch(self, at: At) -> None:
        return None

    def loss(self, batch: None):
        return (10 * self.w).sum(), {}


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_the_loop_sets_lr_and_clips_the_global_norm(clip):
    task = OneStep(clip)
    Loop(LoopOptions(steps=1)).run(task)
    assert task.optims["optim"].optimizer.param_groups[0]["lr"] == 0.5
    step = (1 - task.w.detach()).norm().item()  # = lr * |grad| after clipping
    assert step == pytest.approx(0.5 * (clip if clip else 10 * math.sqrt(3)), rel=1e-4)


def test_atomic_write_leaves_nothing_partial(tmp_path):
    path = tmp_path / "sub" / "model.safetensors"
    atomic_write(path, lambda p: Path(p).write_text("old"))
    assert path.read_text() == "old" and path.stat().st_mode & 0o777 == 0o644

    def fail(p: str) -> None:
        Path(p).write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(path, fail)
    assert path.read_text() == "old" and [p.name for p in path.parent.iterdir()] == ["model.safetensors"]
    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "new.json", fail)
    assert not (tmp_path / "new.json").exists()


def test_write_entry_and_fp16_state(tmp_path):
    tied = torch.nn.Linear(2, 2, bias=False)
    model = torch.nn.ModuleDict({"a": tied, "b": tied})  # b.weight aliases a.weight
    state = fp16_state(model)
    assert set(state) == {"a.weight", "b.weight"} and state["a.weight"].dtype == torch.float16
    assert set(fp16_state(model, untie=True)) == {"a.weight"}
    write_entry(tmp_path / "e", fp16_state(model, untie=True), {"z": 1, "a": [1, 2]})
    text = (tmp_path / "e" / "config.json").read_text()
    assert text.endswith("}\n") and text.index('"a"') < text.index('"z"')  # sorted keys, final newline
    weights = load_file(str(tmp_path / "e" / "model.safetensors"))
    assert list(weights) == ["a.weight"] and torch.equal(weights["a.weight"], state["a.weight"])
    write_entry(tmp_path / "f", state, {"z": 1, "a": 2}, sort_keys=False)
    assert list(json.loads((tmp_path / "f" / "config.json").read_text())) == ["z", "a"]


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model[0].bias.requires_grad_(False)  # a frozen parameter is skipped by the optimiser
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(i))
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


class _Held(TrainTask):
    """What a state file saves and restores: a model, its optimiser and an extra tensor."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, hits: torch.Tensor) -> None:
        self.modules, self.optims, self.hits = {"model": model}, {"optim": Optim(opt, lambda s: 0.0)}, hits

    def batch(self, at: At) -> None: ...

    def loss(self, batch: None) -> None: ...

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"trainer.hits": self.hits}


def test_train_state_round_trip_resumes_exactly(tmp_path):
    model, opt = _trained()
    for i in range(3):
        _step(model, opt, i)
    hits = torch.arange(5.0)
    meta = {"step": 3, "elapsed": 1.5, "history": [{"step": 3, "loss": 0.1}], "config": {"lr": 0.01, "steps": 9}}
    path = tmp_path / "state.safetensors"
    rng = torch.get_rng_state()
    StateFile(path).save(_Held(model, opt, hits), meta)
    assert "optim.0.exp_avg" in load_file(str(path)) and "model.0.weight" in load_file(str(path))

    fresh, fresh_opt = _trained(seed=1)
    fresh_hits = torch.zeros(5)
    got = StateFile(path, {"config": meta["config"]}).load(_Held(fresh, fresh_opt, fresh_hits))
    assert torch.equal(got.pop("torch_rng"), rng)
    assert got == meta and torch.equal(fresh_hits, hits)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(opt.param_groups[0]["params"], fresh_opt.param_groups[0]["params"]):
        assert all(torch.equal(opt.state[p][k], fresh_opt.state[q][k]) for k in opt.state[p])
    _step(model, opt, 3)  # one more step of the original and of the restored run: identical weights
    _step(fresh, fresh_opt, 3)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
def test_resumed_optimiser_moments_live_on_their_parameters_device(tmp_path):
    """The loop moves the modules to its device before the state loads: the moments must follow their parameters
    (the file's tensors are on the CPU; a CUDA run's resume failed its first AdamW step on mixed devices). The meta
    device stands in for a GPU here; the step count stays on the CPU, as torch keeps it."""
    model, opt = _trained()
    _step(model, opt, 0)
    path = tmp_path / "state.safetensors"
    StateFile(path).save(_Held(model, opt, torch.zeros(5)), {"step": 1})
    fresh, _ = _trained(seed=1)
    fresh.to("meta")  # (new parameters: the optimiser is made over them, as a trainer's is over its module's)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    StateFile(path).load(_Held(fresh, fresh_opt, torch.zeros(5)))
    for p in fresh_opt.param_groups[0]["params"]:
        assert {k: v.device.type for k, v in fresh_opt.state[p].items()} == {
            "step": "cpu", "exp_avg": "meta", "exp_avg_sq": "meta"}


def test_trainable_state_holds_only_the_trained_parameters(tmp_path):
    model, opt = _trained()
    _step(model, opt, 0)
    path = tmp_path / "state.safetensors"
    StateFile(path, trainable=True).save(_Held(model, opt, torch.zeros(5)), {"step": 1})
    assert "model.0.bias" not in load_file(str(path)) and "model.0.weight" in load_file(str(path))
    fresh, fresh_opt = _trained(seed=1)
    assert StateFile(path, trainable=True).load(_Held(fresh, fresh_opt, torch.zeros(5)))["step"] == 1
    assert torch.equal(fresh[0].weight, model[0].weight) and not torch.equal(fresh[0].bias, model[0].bias)
    bigger = torch.nn.Sequential(*fresh, torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointError, match="does not fit this run"):
        StateFile(path, trainable=True).load(_Held(bigger, fresh_opt, torch.zeros(5)))
    path.write_bytes(b"not a state")
    with pytest.raises(CheckpointError, match="corrupt"):
        StateFile(path).load(_Held(fresh, fresh_opt, torch.zeros(5)))


def test_train_state_refuses_another_config_but_not_a_new_budget(tmp_path):
    model, opt = _trained()
    task = _Held(model, opt, torch.zeros(5))
    path = tmp_path / "state.safetensors"
    assert StateFile(path, {"config": {}}).load(task) is None
    StateFile(path).save(task, {"step": 0, "config": {"lr": 0.01, "steps": 9}})
    with pytest.raises(StaleStateError, match="different config") as err:
        StateFile(path, {"config": {"lr": 0.02, "steps": 9}}).load(task)
    assert isinstance(err.value, ValueError) and isinstance(err.value, UsageError)
    with pytest.raises(StaleStateError, match="different target_sha"):
        StateFile(path, {"config": {"lr": 0.01, "steps": 9}, "target_sha": "abc"}).load(task)
    assert StateFile(path, {"config": {"lr": 0.01, "steps": 20}}, loose=("steps",)).load(task)["step"] == 0
    with pytest.raises(StaleStateError, match="different config"):  # a setting the state lacks is a change
        StateFile(path, {"config": {"lr": 0.01, "steps": 9, "grad_accum": 1}}).load(task)


def test_a_state_of_an_older_specgen_is_refused_in_one_line(tmp_path):
    """States before the shared loop (one metadata entry per key, no RNG tensor) are not resumed."""
    model, opt = _trained()
    task = _Held(model, opt, torch.zeros(5))
    path = tmp_path / "state.safetensors"
    StateFile(path).save(task, {"step": 0, "config": {"lr": 0.01}})
    tensors = load_file(str(path))
    for tensors, metadata in [(tensors, {"step": "0", "config": json.dumps({"lr": 0.01})}),
                              ({k: v for k, v in tensors.items() if k != "loop.torch_rng"},
                               {"meta": json.dumps({"step": 0})})]:
        save_file(tensors, str(path), metadata=metadata)
        with pytest.raises(StaleStateError, match="made by an older specgen"):
            StateFile(path).load(task)


RECIPES = {  # recipe -> (module, config class)
    "image-gpt": ("image_gpt", "ImageGPTTrainConfig"),
    "image-gpt-lowres": ("image_gpt_lowres", "LowresGPTTrainConfig"),
    "vq-images": ("vq", "VQTrainConfig"),
    "mesh-gpt": ("mesh", "MeshTrainConfig"),
    "eagle-image": ("eagle", "EagleTrainConfig"),
    "image-classifier": ("classifier", "ClassifierTrainConfig"),
    "upsampler-2x": ("upsampler", "UpsamplerTrainConfig"),
    "upsampler-4x": ("upsampler", "UpsamplerTrainConfig"),
    "xspecmesh-heads": ("heads", "HeadsTrainConfig"),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_key_loads_into_the_same_value(recipe):
    module, cls = RECIPES[recipe]
    cls = getattr(importlib.import_module(f"specgen.train.{module}"), cls)
    path = ROOT / "recipes" / "tiny" / f"{recipe}.yaml"
    cfg = load_config(cls, path)
    for key, value in yaml.safe_load(path.read_text()).items():
        joined = key in RECIPE_RELATIVE and value  # read against the recipe's folder
        assert getattr(cfg, key) == (os.path.normpath(path.parent / value) if joined else value), key
    assert load_config(cls, path, ["seed=3"]).seed == 3
    with pytest.raises(UsageError, match="bad config"):
        load_config(cls, path, ["no_such_key=1"])


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_resolves_its_paths_from_any_folder(recipe, tmp_path, monkeypatch):
    """The tiny recipes ran only from the repository root: elsewhere `vq: specgen/assets/image/vq` was no folder and
    `ship_dir: specgen/assets/...` was a folder of the working directory, not the built-in's package folder, so the
    run refused to register the built-in it rebuilds. The VQ is a registry name; ship_dir is the recipe's folder's."""
    module, cls = RECIPES[recipe]
    cls = getattr(importlib.import_module(f"specgen.train.{module}"), cls)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    cfg = load_config(cls, ROOT / "recipes" / "tiny" / f"{recipe}.yaml")
    if getattr(cfg, "vq", ""):
        assert vq_entry(cfg.vq).meta["builder"] == "vq"
    if getattr(cfg, "ship_dir", ""):
        assert Path(cfg.ship_dir).resolve().is_relative_to(ASSETS.resolve()), cfg.ship_dir
        kind = {"image-gpt": "target", "image-gpt-lowres": "target", "eagle-image": "draft",
                "upsampler-2x": "upsampler"}.get(recipe)
        if kind:  # a built-in rebuilt: its package folder, else the built-in's name is refused
            check_outputs([(kind, cfg.name, cfg.ship_dir)])
    assert not any((tmp_path / "cwd").iterdir())


@pytest.mark.parametrize("recipe", ["image-gpt", "image-gpt-lowres", "upsampler-2x", "image-classifier"])
def test_the_default_vq_loads_outside_the_repository(recipe, tmp_path, monkeypatch):
    """Each VQ trainer without a recipe (an installed package, any working directory) finds its default VQ."""
    module, cls = RECIPES[recipe]
    cfg = getattr(importlib.import_module(f"specgen.train.{module}"), cls)()
    monkeypatch.chdir(tmp_path)
    _, meta, _ = load_vq(cfg.vq)
    assert meta["name"] == getattr(cfg, "vq_name", "tiny-image-vq")  # the name recorded is the VQ used
    assert vq_reconstructions(cfg.vq, torch.zeros(2, 3, 64, 64)).shape == (2, 3, 64, 64)  # the classifier's path


def test_script_parser_loads_recipe_overrides_and_logger(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 2.0e-3\nwarmup_steps: 7\n")
    parser = script_parser("specgen.train.x", "Train x.", "recipes/tiny/x.yaml")
    argv = ["--config", str(recipe), "--out", str(tmp_path / "run"), "min_lr=1e-5"]
    cfg, _, log = parse_recipe(parser, OptimConfig, argv)
    assert (cfg.lr, cfg.warmup_steps, cfg.min_lr, cfg.beta2) == (2e-3, 7, 1e-5, 0.95)
    assert not (tmp_path / "run").exists()  # the run folder appears with the first log line
    log("hello")
    assert (tmp_path / "run" / "train.log").read_text().endswith(" hello\n")
    with pytest.raises(UsageError):
        parse_recipe(parser, OptimConfig, ["--out", str(tmp_path), "lr0=1"])
    with pytest.raises(SystemExit):
        parse_recipe(script_parser("m", "", "r.yaml", config_required=True), OptimConfig, ["--out", "x"])
    capsys.readouterr()
    assert print_metrics({"loss": 1.0, "history": [1, 2]}) == 0
    assert json.loads(capsys.readouterr().out) == {"loss": 1.0}


def test_run_script_turns_specgen_errors_into_one_line_and_exit_code(capsys, monkeypatch):
    from specgen.errors import CheckpointError, UsageError
    from specgen.train.script import run_script

    monkeypatch.delenv("SPECGEN_DEBUG", raising=False)

    def bad_recipe() -> int:
        raise UsageError("bad config: no key 'stepz'")

    def missing() -> int:
        raise CheckpointError("no such checkpoint")

    assert run_script(bad_recipe) == 2 and run_script(missing) == 1 and run_script(lambda: 0) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: bad config: no key 'stepz'", "error: no such checkpoint"]


def test_token_caches_refuse_an_unwritable_folder_before_the_build_and_rebuild_a_corrupt_file(tmp_path):
    """An unwritable cache (data_cache=/etc/passwd) failed exit 1 after the build's work (EAGLE's samples: minutes);
    a truncated cache file failed with a bare SafetensorError naming no file."""
    built = []

    def build():
        built.append(1)
        return {"t": torch.arange(3)}

    (tmp_path / "afile").write_text("x")
    with pytest.raises(UsageError, match="afile is a file, not a folder"):
        cached_tensors(tmp_path / "afile" / "k.safetensors", build, print)
    assert not built
    path = tmp_path / "cache" / "k.safetensors"
    path.parent.mkdir()
    path.write_bytes(b"\x10\x00")
    assert cached_tensors(path, build, print)["t"].tolist() == [0, 1, 2] and built == [1]
    assert load_file(str(path))["t"].tolist() == [0, 1, 2]  # rewritten whole


@pytest.mark.parametrize("vq_name,needle", [("nosuch", "vq_name=nosuch: unknown checkpoint"),
                                            ("tiny-image-gpt", "is not a VQ tokenizer")])
def test_vq_name_must_be_the_vq_trained_on(vq_name, needle):
    """vq_name=nosuch trained and registered an image GPT that generate refused ('unknown checkpoint nosuch'): the
    name recorded is how the GPT's tokens are decoded, so it must name the VQ of `vq`."""
    from specgen.train.image_gpt import ImageGPTTrainConfig, check_vq_name

    check_vq_name(ImageGPTTrainConfig(vq="tiny-image-vq", vq_name="tiny-image-vq"))
    with pytest.raises(UsageError, match=needle):
        check_vq_name(ImageGPTTrainConfig(vq="tiny-image-vq", vq_name=vq_name))


def test_vq_name_of_other_weights_is_refused(tmp_path):
    """A retrained VQ folder as vq= with the default vq_name recorded the shipped VQ for decoding: wrong codebook."""
    import shutil

    from specgen import checkpoints
    from specgen.train.image_gpt import ImageGPTTrainConfig, check_vq_name

    folder = shutil.copytree(checkpoints.find("tiny-image-vq").path, tmp_path / "vq")
    weights = load_file(str(folder / "model.safetensors"))
    weights["quantize.embedding.weight"] += 1
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(UsageError, match="is not the VQ of vq=.*other weights"):
        check_vq_name(ImageGPTTrainConfig(vq=str(folder), vq_name="tiny-image-vq"))
    check_vq_name(ImageGPTTrainConfig(vq=str(folder), vq_name=""))  # none recorded


def test_a_killed_writers_training_state_temporary_goes_at_the_next_save(tmp_path):
    """`kill -9` of a training run while it wrote its state left `.state.safetensors.*.tmp` (the state's size) in its
    --out for good; the next save of that state removes one untouched for an hour and keeps a fresh one (a live
    writer's) and other files' temporaries."""
    import time

    from specgen.tensor_files import save_tensors

    stale, live, other = (tmp_path / n for n in (".state.safetensors.ab12cd.tmp", ".state.safetensors.ef34ab.tmp",
                                                  ".other.safetensors.ab12cd.tmp"))
    for f in (stale, live, other):
        f.write_bytes(bytes(64))
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    os.utime(other, (time.time() - 2 * 3600,) * 2)
    save_tensors(tmp_path / "state.safetensors", {"w": torch.zeros(2)})
    assert not stale.exists() and live.exists() and other.exists()
