"""Token digests of every method in the method table, at batch 1 and 3, greedy and sampled, on tiny models.

The stored digests were made by the code at 984446b (before issue 45's refactor), the sampled ones again in session 92
(every draw one uniform by inverse CDF, the tree walk batched: `accept_sampled`): a change that moves any token of any
method fails here. Regenerate them only on purpose (a method whose output is meant to change):
`python -m tests.methods.test_digests` prints the table to paste below.
"""

from __future__ import annotations

import functools
import hashlib
import json

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.generate.image_methods import ImageParts, build_image_method
from specgen.image.neighbours import compute_neighbours
from specgen.image.target import CFGTarget
from specgen.methods import METHODS, run_batch
from specgen.methods.mulo_sd import MuLoSD
from specgen.methods.xspecmesh import MeshDecoder
from specgen.models.upsampler import UpDownSampler, UpsamplerConfig
from tests.conftest import method_drafter, tiny_model
from tests.image.helpers import TinyEagle, tiny_image_gpt
from tests.image_fixtures import one_thread
from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model

PARAMS = {"greedy": SamplingParams(), "sampled": SamplingParams(1.0, 0, 0.95)}
BATCHES = (1, 3)
TEXT_PROMPTS = [[5, 17, 3, 9, 40, 2], [11, 11, 7], [60, 1, 8, 30, 22, 9, 14, 5, 5, 3, 0, 19]]
IMAGE_GRID, IMAGE_LABELS = 4, [0, 2, 1]


def gens(n: int, base: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(base + i) for i in range(n)]


def text_tokens(name: str, params: SamplingParams, batch_size: int) -> list[list[int]]:
    target = ModelTarget(tiny_model(7))
    res = run_batch(target, lambda i: method_drafter(name), TEXT_PROMPTS, 16, params, (),
                    gens(len(TEXT_PROMPTS), 20), batch_size)
    return [r.tokens for r in res.results]


def image_parts(seed: int = 1) -> ImageParts:
    model = tiny_image_gpt(seed, grid=IMAGE_GRID)
    codebook = torch.randn(model.cfg.vocab_size, 8, generator=torch.Generator().manual_seed(seed))
    return ImageParts(model, CFGTarget(model, 3.0), TinyEagle(model).eval(), codebook, IMAGE_GRID)


@functools.cache
def mulo_assets() -> tuple[torch.nn.Module, UpDownSampler]:
    """A 2x2 low-res drafter and a 2x up-sampler of `image_parts`' codebook (rows of a batch share them)."""
    lowres = tiny_image_gpt(3, grid=IMAGE_GRID // 2, classes=3)
    torch.manual_seed(4)
    pair = UpDownSampler(UpsamplerConfig(codebook_size=32, embed_dim=8, scale=2, channels=8, blocks=1)).eval()
    pair.codebook.copy_(image_parts().codebook)
    return lowres, pair


def mulo_decoder(parts: ImageParts):
    """MuLo-SD on `mulo_assets` (no registry), rejecting and re-sampling some tokens (tau 0.05, radius 1)."""
    lowres, pair = mulo_assets()
    return MuLoSD(lowres, pair, compute_neighbours(parts.codebook, 4), IMAGE_GRID, tau=0.05, radius=1), None


#: image methods built from something else than `build_image_method` on `image_parts` (assets from the registry)
IMAGE_BUILDERS = {"mulo-sd": mulo_decoder}


def image_tokens(name: str, params: SamplingParams, batch_size: int) -> list[list[int]]:
    parts = image_parts()
    build = IMAGE_BUILDERS.get(name, lambda p: build_image_method(name, p, {}))
    rule = build(parts)[1]
    res = run_batch(parts.target, lambda i: build(parts)[0], [[c] for c in IMAGE_LABELS], IMAGE_GRID ** 2, params,
                    (), gens(len(IMAGE_LABELS), 30), batch_size, rule=rule, max_draft=32)
    return [r.tokens for r in res.results]


@functools.cache
def mesh_clouds() -> list[torch.Tensor]:
    return procedural_clouds(range(11, 14))


MESH_OPTIONS = {"xspecmesh": {"delta": 0.0}}  # a threshold its tiny random heads pass: sampled drafts get accepted


def mesh_tokens(name: str, params: SamplingParams, batch_size: int) -> list[list[int]]:
    spec = METHODS[name]
    decoder = MeshDecoder(tiny_mesh_model(), tiny_heads() if spec.modality == "mesh" else None)
    clouds = mesh_clouds()
    opts = spec.parse_options(MESH_OPTIONS.get(name, {})) if spec.modality == "mesh" else None
    res = decoder.generate_batch(clouds, params, 40, opts, gens(3, 40), gens(3, 140), batch_size)
    return [r.tokens for r in res]


RUNNERS = {"text": text_tokens, "image": image_tokens, "mesh": mesh_tokens}
CASES = [(name, modality) for name, spec in METHODS.items() for modality in RUNNERS if spec.runs_on(modality)]


def digest(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def digests_of(name: str, modality: str, batch_size: int) -> dict[str, str]:
    return {p: digest(RUNNERS[modality](name, params, batch_size)) for p, params in PARAMS.items()}


DIGESTS: dict[str, dict[str, str]] = {
    'ar/text': {'greedy': '9ec78fc380b90e6c', 'sampled': '2bf9e9ac27fee0fd'},
    'ar/image': {'greedy': '9923b10ee9ac50d1', 'sampled': 'f7af0e9596f1da4e'},
    'ar/mesh': {'greedy': '4e3a413f67e41b88', 'sampled': '451ff6aa2f581389'},
    'jacobi/text': {'greedy': '9ec78fc380b90e6c', 'sampled': '206fde9a5d251d51'},
    'ngram/text': {'greedy': '9ec78fc380b90e6c', 'sampled': 'a4a32b26287ee19b'},
    'cllm/text': {'greedy': '9ec78fc380b90e6c', 'sampled': 'f66e13d0b4e5a934'},
    'pcllm/text': {'greedy': '9ec78fc380b90e6c', 'sampled': '206fde9a5d251d51'},
    'pcllm-mr/text': {'greedy': '9ec78fc380b90e6c', 'sampled': '4c9d621bd3409999'},
    'xspecmesh/mesh': {'greedy': '4e3a413f67e41b88', 'sampled': '3c137f63e49bb484'},
    'eagle2/image': {'greedy': '9923b10ee9ac50d1', 'sampled': 'bab57d42d82238d0'},
    'adt-tree/image': {'greedy': '9923b10ee9ac50d1', 'sampled': 'a252ce2ede216865'},
    'lantern/image': {'greedy': '9923b10ee9ac50d1', 'sampled': '972d57449f703f15'},
    'adt-tree+lantern/image': {'greedy': '9923b10ee9ac50d1', 'sampled': '8f3a78d456bd7690'},
    'vvs/image': {'greedy': '0ba114f6e84dab7a', 'sampled': '194a7e93e0d72167'},
    'mulo-sd/image': {'greedy': '7eb07fc387b68343', 'sampled': '6447d15a3d03ad69'},
}


def print_digests() -> None:
    """The DIGESTS table of the current code, to paste above (a deliberate change of some method's tokens)."""
    print("DIGESTS: dict[str, dict[str, str]] = {")
    for name, modality in CASES:
        print(f"    {name + '/' + modality!r}: {digests_of(name, modality, 1)!r},")
    print("}")


_threads = pytest.fixture(autouse=True)(one_thread)  # tiny models: one thread

@pytest.mark.parametrize("name,modality", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_tokens_match_the_stored_digests(name, modality):
    assert f"{name}/{modality}" in DIGESTS, "a new method: add its digests (see the module docstring)"
    for batch_size in BATCHES:  # a row's tokens do not depend on its batch: one digest for both sizes
        assert digests_of(name, modality, batch_size) == DIGESTS[f"{name}/{modality}"], batch_size


if __name__ == "__main__":
    torch.set_num_threads(1)
    print_digests()
