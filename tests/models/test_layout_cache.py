"""Layout cache: a second load maps the decoded weights (and int4 kernel operands) from disk and lays out nothing; a
changed key, a corrupt file or an unwritable folder loads as before (rewriting, or warning once), same outputs."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from specgen import checkpoints, native, registry
from specgen import precision
from specgen.models import layout_cache, packed_linear, plan_cache
from specgen.models.layout import ENV, decode_layout
from specgen.models.tiled_weight import TiledWeight
from specgen.native import ops
from tests.conftest import tiny_model

TOKENS = torch.tensor([[5, 17, 3, 9, 40, 2], [11, 11, 7, 60, 1, 8]])


@pytest.fixture(params=["packed", "col"])
def entry(request, monkeypatch):
    """A tiny tied target in the registry, decoded in `packed` (the tied embedding and the other weights held as tiles
    where tiled.c is built) or `col` layout."""
    if request.param == "packed" and not packed_linear.available():
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setenv(ENV, request.param)
    monkeypatch.setattr(plan_cache, "WARNED", set())
    model = tiny_model(5, tie_embeddings=True)
    return registry.save("target", "tiny", model.state_dict(), {"builder": "transformer",
                                                                "kwargs": model.cfg.to_dict()})


@pytest.fixture
def copies(monkeypatch) -> list[str]:
    """The calls that copy weights into a module (a checkpoint read, a tile fill), by name, as they happen."""
    made = []
    for owner, name in ((checkpoints, "load_state"), (ops, "fill_tiles")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, real=real, name=name: made.append(name) or real(*a))
    return made


def load(entry) -> torch.nn.Module:
    """As `TextSource.load`: built in the decode layout, mapped or loaded (`checkpoints.load_module`)."""
    return checkpoints.load_module(entry, decode=True)


def logits(module) -> torch.Tensor:
    with torch.inference_mode():
        return module(TOKENS, torch.arange(TOKENS.shape[1]).expand(2, -1))[0]


#: The tests that find which mapping holds a tensor read /proc/self/maps: Linux only.
LINUX_MAPS = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps (Linux)")


def cache_files() -> list[Path]:
    return sorted(layout_cache.folder().glob("*.safetensors"))


def mapping_of(t: torch.Tensor) -> str:
    """The /proc/self/maps name of the mapping holding `t`'s first element ('' when anonymous)."""
    ptr = (t.tiles if isinstance(t, TiledWeight) else t).data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= ptr < hi:
            return fields[5] if len(fields) > 5 else ""
    return ""


@LINUX_MAPS
def test_a_second_load_maps_the_stored_layout_and_lays_out_nothing(entry, copies):
    first = load(entry)
    assert "load_state" in copies and len(cache_files()) == 1
    copies.clear()
    second = load(entry)
    assert copies == []  # no checkpoint read, no tile filled
    assert torch.equal(logits(second), logits(first))
    for (name, a), (_, b) in zip(first.state_dict(keep_vars=True).items(), second.state_dict(keep_vars=True).items()):
        assert type(a) is type(b) and a.stride() == b.stride() and torch.equal(a, b), name
    assert second.output.weight is second.tok_embeddings.weight  # a tie stays a tie
    wqkv = second.layers[0].attention.wqkv.weight
    assert isinstance(wqkv, TiledWeight) == (os.environ[ENV] == "packed" and native.library("tiled") is not None)
    assert mapping_of(wqkv) == str(cache_files()[0].resolve())  # the file's pages, not a copy


@pytest.mark.parametrize("change", ["another CPU or torch", "the checkpoint rewritten"])
def test_a_changed_key_lays_out_again_and_rewrites(entry, copies, monkeypatch, change):
    expected = logits(load(entry))
    if change == "another CPU or torch":
        monkeypatch.setattr(plan_cache, "machine", lambda: "other-cpu-flags")
    else:
        weights = entry.path / registry.WEIGHTS
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    copies.clear()
    assert torch.equal(logits(load(entry)), expected) and "load_state" in copies
    copies.clear()
    assert torch.equal(logits(load(entry)), expected) and copies == []  # the rewritten file is read
    assert len(cache_files()) == 1  # replaced, not added beside


@pytest.mark.parametrize("damage", ["truncated", "not safetensors", "other shapes"])
def test_a_corrupt_file_is_ignored_and_rewritten(entry, copies, damage):
    expected = logits(load(entry))
    path = cache_files()[0]
    if damage == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    elif damage == "not safetensors":
        path.write_bytes(b"\xff" * 64)
    else:  # a valid file under the right key whose tensors do not fit the model
        with layout_cache.safe_open(str(path), "pt") as f:
            key, names = f.metadata()["key"], list(f.keys())
        layout_cache.save_aligned({n: torch.zeros(3) for n in names if not n.endswith(layout_cache.PAD)}, path, key)
    copies.clear()
    assert torch.equal(logits(load(entry)), expected) and "load_state" in copies
    copies.clear()
    assert torch.equal(logits(load(entry)), expected) and copies == []


@pytest.mark.parametrize("fault", ["a file in the way", "a full device"])
def test_an_unwritable_cache_folder_warns_once_and_loads(entry, monkeypatch, fault):
    expected = logits(decode_layout(checkpoints.load_module(entry)))  # loaded as before the cache
    if fault == "a file in the way":
        layout_cache.folder().parent.mkdir(parents=True, exist_ok=True)
        layout_cache.folder().write_text("")
    else:
        def full(*args):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(layout_cache, "save_aligned", full)
    with pytest.warns(UserWarning, match="decoded weights are not cached") as warned:
        assert torch.equal(logits(load(entry)), expected)
        assert torch.equal(logits(load(entry)), expected)
    assert len([w for w in warned if "not cached" in str(w.message)]) == 1
    assert not layout_cache.folder().is_dir() or cache_files() == []  # no partial file left


@LINUX_MAPS
def test_quantized_kernel_operands_are_mapped_not_packed_again():
    model = tiny_model(2)
    base = registry.save("target", "tiny", model.state_dict(), {"builder": "transformer", "vocab_size": 64,
                                                                "kwargs": model.cfg.to_dict(), "modality": "text"})
    entry = precision.quantized_entry(base, "int4")

    def load_int4():
        return checkpoints.load_module(entry, "cpu", torch.bfloat16, decode=True)

    first, second = load_int4(), load_int4()
    assert torch.equal(logits(second), logits(first))
    head = (second.output,) if native.library("qmm") else ()  # torch's int8 product (no qmm.c) reads no operands
    for lin in (second.layers[0].attention.wqkv, *head):  # int4 layers and the int8 head
        made = lin._kernel[3]
        assert made and {mapping_of(t) for t in made.values()} == {str(cache_files()[0].resolve())}  # not packed again


def test_the_file_of_a_removed_entry_goes_at_the_next_store(entry):
    """A cache file whose checkpoint is gone can never be read again: the next file written removes it."""
    load(entry)
    [old] = cache_files()
    model = tiny_model(6, tie_embeddings=True)
    other = registry.save("target", "tiny2", model.state_dict(), {"builder": "transformer",
                                                                  "kwargs": model.cfg.to_dict()})
    registry.remove(entry.name)
    load(other)
    assert cache_files() != [] and old not in cache_files()


def test_a_killed_writers_temporary_goes_at_the_next_store(entry):
    """A writer killed mid-write (SIGKILL, the OOM killer: laying out a model takes its size again in memory) left its
    hidden temporary, as large as the model's layout, that nothing removed; the next store removes one untouched
    for an hour (a live writer writes without pause, then renames), and keeps a fresh one."""
    import time

    layout_cache.folder().mkdir(parents=True)
    stale, live = (layout_cache.folder() / f".{n}.safetensors.abc123.tmp" for n in ("killed", "writing"))
    stale.write_bytes(bytes(64))
    live.write_bytes(bytes(64))
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    load(entry)
    assert cache_files() and not stale.exists() and live.exists()


def test_a_dtype_the_writer_cannot_name_is_not_cached():
    """A tensor of a dtype outside the writer's table leaves the model uncached (loaded as before), never a crash."""
    m = torch.nn.Linear(2, 2)
    assert layout_cache.held(m) is not None
    m.register_buffer("odd", torch.zeros(2, dtype=torch.complex64))
    assert layout_cache.held(m) is None
