"""Native kernels: installed, else built once per machine into the cache, skipped cleanly (torch path) without a
compiler."""

from __future__ import annotations

import pytest

from specgen import native


@pytest.fixture
def fresh(monkeypatch, tmp_path, tmp_path_factory):
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "INSTALLED_DIR", tmp_path_factory.mktemp("installed"))  # as a checkout never installed
    native.library.cache_clear()
    monkeypatch.setattr(native, "WARNED", [])
    yield tmp_path
    native.library.cache_clear()


def test_no_compiler_means_the_torch_path(fresh, monkeypatch):
    monkeypatch.setenv("CC", str(fresh / "no-such-compiler"))
    assert native.built("attention")[0] is None and native.library("attention") is None
    assert native.describe().startswith("torch")


@pytest.mark.parametrize("cc", ["no-such-compiler", "/bin/false"])
def test_a_missing_or_failing_compiler_is_one_warning_line(fresh, monkeypatch, capsys, cc):
    monkeypatch.setenv("CC", cc)
    assert native.library("attention") is None and native.library("glue") is None and native.library("tiled") is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: native kernels not used (") and cc in lines[0], lines
    assert "torch path" in lines[0]


def test_garbage_in_the_cache_is_rebuilt(fresh, capsys):
    first = native.built("glue")[0]
    if first is None:
        pytest.skip("no C compiler here")
    first.write_bytes(b"garbage, not a shared library")
    assert native.library("glue") is not None  # removed and built again
    assert first.read_bytes()[:4] == b"\x7fELF" and capsys.readouterr().err == ""


def test_specgen_native_0_turns_it_off(fresh, monkeypatch, capsys):
    monkeypatch.setenv("SPECGEN_NATIVE", "0")
    assert native.library("attention") is None and capsys.readouterr().err == ""  # asked for: no warning


@pytest.mark.slow
def test_a_build_is_cached_by_source_flags_compiler_and_cpu(fresh):
    first = native.built("glue")[0]
    if first is None:
        pytest.skip("no C compiler here")
    assert first.parent == fresh and native.built("glue")[0] == first  # the second call compiles nothing
    assert native.library("glue") is not None
    assert [p.name for p in fresh.iterdir()] == [first.name]  # no temporary file left behind
    assert native.describe().startswith("native")


def test_sixteen_lane_kernels_only_where_the_cpu_holds_them_in_registers(fresh, monkeypatch):
    """attention.c (vec16.h's 16-lane vectors) is loaded where those live in registers: AVX-512F, or AVX2 + FMA as two
    ymm halves. Elsewhere GCC's 64-byte vectors go through the stack (2-10x slower than torch on an AVX2 CPU before
    vec16.h had its halves): not loaded, while the row kernels and the tiled products still are."""
    if native.built("glue")[0] is None:
        pytest.skip("no C compiler here")
    for flags, wide in (("fpu sse2 avx", False), ("fpu sse2 avx avx2", False), ("fpu sse2 avx avx2 fma", True),
                        ("fpu sse2 avx avx2 fma avx512f avx512bw", True)):
        monkeypatch.setattr(native, "cpu_signature", lambda f=flags: f"model name\t: a CPU\nflags\t\t: {f}")
        assert native.sixteen_lanes() is wide, flags
    native.library.cache_clear()
    monkeypatch.setattr(native, "cpu_signature", lambda: "model name\t: an old CPU\nflags\t\t: fpu sse2 avx")
    assert native.library("attention") is None and native.library("glue") is not None and native.library("tiled") is not None
    assert native.describe() == "native C (glue, tiled, qmm)"


def test_a_failed_compile_leaves_nothing_and_falls_back(fresh, monkeypatch, tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    (src / "attention.c").write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCE_DIR", src)
    assert native.built("attention")[0] is None
    assert list(fresh.iterdir()) == []


def test_attention_in_ymm_halves_computes_the_zmm_bits(fresh, monkeypatch):
    """An AVX-512 CPU's attention.c (16-lane zmm vectors) and a build without AVX-512 (vec16.h's two ymm halves, the
    only build on an AVX2-only CPU, with its own score, value and exp loops) give the same bits: every sum runs in
    the same order lane by lane. Runs where the CPU has AVX-512 (elsewhere there is only the halves build)."""
    import ctypes

    import torch

    from specgen.models.attention import invariant_attention, native_plan

    if "avx512f" not in native.cpu_signature() or native.library("attention") is None:
        pytest.skip("needs an AVX-512 CPU and a C compiler")
    path, _ = native.compile_library("attention", native.FLAGS + ("-mno-avx512f",))
    if path is None:
        pytest.skip("this compiler cannot build attention.c without AVX-512")
    halves = ctypes.CDLL(str(path))
    for name, (args, result) in native.SIGNATURES["attention"].items():
        getattr(halves, name).argtypes, getattr(halves, name).restype = args, result
    torch.manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        for (h, hkv, d), (b, s, t) in ((9, 3, 64), (2, 17, 150)), ((8, 8, 32), (3, 5, 77)), ((4, 2, 40), (2, 70, 90)):
            q = torch.randn(b, h, s, d).to(dtype)
            k, v = torch.randn(b, hkv, t, d).to(dtype), torch.randn(b, hkv, t, d).to(dtype)
            mask = torch.rand(b, 1, s, t) < 0.6
            mask[..., : t // 3] = True  # a shared prefix, then tree-like holes
            p = native_plan(mask, b, s, t, h, d, dtype=dtype)
            with torch.inference_mode():
                own = invariant_attention(q, k, v, p).clone()
                with monkeypatch.context() as m:
                    m.setattr(native, "library", lambda name: halves)  # the same op into the other build
                    other = invariant_attention(q, k, v, p)
            assert torch.equal(own, other), (dtype, h, hkv, d, b, s, t)


def test_an_installed_library_comes_first_and_only_for_its_cpu_and_sources(fresh, monkeypatch):
    """setup.py's build (`native.INSTALLED_DIR`) is loaded before the cache is looked at; a library built for another
    CPU kind or from other sources is not there under this CPU's name, so the cache takes over."""
    cc, _ = native.compiler()
    if cc is None:
        pytest.skip("no C compiler here")
    there = native.installed("glue", native.FLAGS)
    assert native.compile_to(cc, "glue", native.FLAGS, there) == ""
    assert native.built("glue")[0] == there and list(fresh.iterdir()) == []
    monkeypatch.setattr(native, "cpu_signature", lambda: "model name\t: another CPU\nflags\t\t: fpu sse2")
    assert native.built("glue")[0].parent == fresh  # compiled into the cache under the other CPU's name
