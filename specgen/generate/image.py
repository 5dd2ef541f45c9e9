"""Image generation with any image method (c2i classes or t2i caption features): the library behind `generate`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from specgen import checkpoints, registry
from specgen.decoding.budget import MeasuredBudget
from specgen.decoding.cost import Tokens, cost_of, relative
from specgen.decoding.stats import DecodeStats
from specgen.errors import IncompatibleError, UsageError
from specgen.generate.image_methods import ImageParts, build_image_method
from specgen.image.captions import Caption, read_captions
from specgen.image.grid import image_grid
from specgen.image.target import cfg_target
from specgen.methods import run_batch
from specgen.methods.eagle import DrafterForward
from specgen.models.graphs import attach
from specgen.models.layout import decode_layout
from specgen.paths import write_linked
from specgen.precision import in_memory, load_precision
from specgen.request import DecodeRequest


@dataclass
class ImageGenConfig:
    """Options of `specgen generate` for images (recipe keys)."""

    method: str = "adt-tree"
    model: str = "tiny-image-gpt"
    drafter: str = ""  # "" = the target's shipped drafter (its config's "drafter")
    num: int = 0  # images; 0 = 8 (c2i) or one per caption (t2i)
    classes: list[str] = field(default_factory=list)  # c2i: names or ids; empty = cycle through all classes
    captions: str = ""  # t2i: caption-features file (.safetensors/.npz: features [N, L, C] + mask [N, L]; .npy)
    cfg_scale: float = 4.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (specgen/devices.py)
    graphs: str = "auto"  # auto | on | off: CUDA-graph captured decode steps (auto: on for CUDA; models/graphs.py)
    dtype: str | None = None  # float32 | bfloat16 | float16: GPT's and drafter's weights, activations, KV cache
    #                           (default float32; bfloat16 when quantized)
    quantize: str | None = None  # int8 | int4: the GPT's block weights, weight-only, quantized at load (CPU)
    out_dir: str = "specgen-images"
    batch_size: int = 1  # images decoded together (B images x the CFG pair per forward; continuous batching)
    method_options: dict = field(default_factory=dict)


@dataclass
class ImageModel:
    """A loaded image target with its VQ decoder, class names and (optional) EAGLE drafter."""

    entry: registry.Entry
    model: torch.nn.Module
    vq: torch.nn.Module
    classes: list[str]
    grid: int
    drafter_net: torch.nn.Module | None
    # method row -> its `budget=auto` MeasuredBudget: what it measured carries over between decode calls
    budgets: dict = field(default_factory=dict, repr=False)

    @property
    def text_conditional(self) -> bool:
        return self.model.cfg.cond_kind == "caption"

    def parts(self, cfg_scale: float, caption: Caption | list[Caption] | None = None) -> ImageParts:
        """Method inputs; a t2i model's target is conditioned on `caption` (a list: one per sequence)."""
        codebook = self.vq.quantize.embedding.weight.detach().float()
        return ImageParts(self.model, cfg_target(self.model, cfg_scale, caption), self.drafter_net, codebook, self.grid)


def load_image_model(name: str, drafter: str = "", device: str = "cpu", need_drafter: bool = True,
                     dtype: str | None = None, quantize: str | None = None, graphs: str = "auto") -> ImageModel:
    """Target + VQ (+ drafter) checked to fit (codebook size, drafter parent), on `device` in `dtype` / `quantize` (the
    GPT's and the drafter's; the VQ stays float32: docs/precision.md)."""
    device, dtype, quantize, torch_dtype = load_precision(dtype, quantize, device)
    entry = checkpoints.find(name)
    if entry.meta.get("modality") != "image":
        raise UsageError(f"{entry.ref} is not an image model")
    if entry.kind != "target":  # a drafter, up-sampler, VQ or classifier is an image entry too, but no GPT
        raise UsageError(f"{entry.ref} is not a target entry; --model takes an image GPT (drafters are --drafter, "
                         "up-samplers method_options.upsampler=NAME)")
    model = decode_layout(in_memory(checkpoints.load_module(entry, device), dtype, quantize))
    if not entry.meta.get("vq"):
        raise UsageError(f"{entry.ref} records no VQ decoder; import it with --vq NAME "
                         "(specgen registry import ... --builder llamagen-gpt --vq NAME)")
    vq_entry = checkpoints.find(entry.meta["vq"])
    vq = checkpoints.load_module(vq_entry, device)
    codes = vq.quantize.embedding.weight.shape[0]
    if codes != model.cfg.vocab_size:
        raise IncompatibleError(f"VQ {vq_entry.ref} has {codes} codes but {entry.ref} predicts {model.cfg.vocab_size}")
    net = None
    drafter = drafter or entry.meta.get("drafter", "") or (default_drafter(entry) if need_drafter else "")
    if need_drafter and drafter:
        d_entry = checkpoints.find(drafter)
        registry.check_pair(d_entry, entry)
        net = decode_layout(checkpoints.load_module(d_entry, device, torch_dtype))
    grid = int(entry.meta.get("grid") or model.cfg.rope_grid)
    for module in (model, net) if net is not None else (model,):  # captured steps on CUDA (models/graphs.py)
        attach(module, graphs)
    return ImageModel(entry, model, vq, list(entry.meta.get("classes", [])), grid, net)


def default_drafter(target: registry.Entry) -> str:
    """The drafter used when none is named: the built-in one trained for `target`, else the one installed one trained
    for it, else ""; several installed and no built-in: one line asking for --drafter."""
    trained = []
    for e in checkpoints.list_entries("draft"):
        try:
            if checkpoints.find(e.ref).meta.get("parent") in (target.ref, target.name):
                trained.append(e)
        except Exception:  # a broken entry is not a candidate; the user can still name one explicitly
            continue
    shipped = [e for e in trained if e.builtin]
    if shipped or len(trained) == 1:
        return (shipped or trained)[0].ref
    if trained:
        raise UsageError(f"{len(trained)} drafters were trained for {target.ref} ({', '.join(e.ref for e in trained)})"
                         "; name one with --drafter NAME")
    return ""


def resolve_classes(spec: list[str], names: list[str], count: int, num: int) -> list[int]:
    """Class ids for `num` images of a model of `count` classes (`names`: theirs, where its entry records them): the
    given names or ids cycled, or every class in turn."""
    ids = []
    for c in map(str, spec):
        if c.isdigit() and int(c) < count:
            ids.append(int(c))
        elif c in names:
            ids.append(names.index(c))
        elif c.isdigit():  # an id past the embedding's rows would fail in the forward (or pick the null class)
            raise UsageError(f"class id {c} is out of range: the model has {count} classes, ids 0-{count - 1}")
        else:
            raise UsageError(f"unknown class '{c}'; {class_hint(c, names, count)}")
    pool = ids or list(range(count))
    return [pool[i % len(pool)] for i in range(num)]


def class_hint(name: str, names: list[str], count: int) -> str:
    """What an unknown class's refusal offers: the close names, else every name where few, else how to name one."""
    if near := difflib.get_close_matches(name, names, n=3):
        return f"did you mean {', '.join(near)}?"
    if not names:
        return f"the model records no class names: give ids 0-{count - 1}"
    return f"classes: {', '.join(names)}" if len(names) <= MAX_LISTED else f"give one of its {len(names)} class names"


MAX_LISTED = 32  # class names an unknown one's refusal lists (ImageNet's 1000 would be no line to read)
DEFAULT_NUM = 8  # c2i images when `num` is 0
MAX_DRAFT = 128  # the loop's cap on a row's draft depth (a tree's nodes past it: its pool's max_feed sizes the cache)
# how each command spells the condition options in its one-line errors: name -> flag
GENERATE_FLAGS = {"classes": "--classes", "captions": "--captions FILE", "num": "--num"}


def image_conditions(im: ImageModel, cfg: ImageGenConfig, flags: dict[str, str] = GENERATE_FLAGS
                     ) -> list[int] | list[Caption]:
    """What each image is conditioned on: class ids (c2i) or left-padded captions (t2i), cycled to `num`; conditions
    of the wrong kind, or a t2i model without captions, are usage errors naming `flags`."""
    if not im.text_conditional:
        if cfg.captions:
            raise UsageError(f"{im.entry.ref} is class-conditional (c2i): it takes class labels ({flags['classes']}), "
                             f"not caption features ({flags['captions']})")
        num = cfg.num or DEFAULT_NUM
        ids = resolve_classes(cfg.classes, im.classes, im.model.cfg.num_classes, num)
        if len(cfg.classes) > num:  # cycled over `num` images: the classes past it would be drawn never, unsaid
            given = "" if cfg.num else " (the default)"
            raise UsageError(f"{flags['classes']} names {len(cfg.classes)} classes but {flags['num']} {num}{given} "
                             f"draws {num}: {', '.join(map(str, cfg.classes[num:]))} would not be drawn; give "
                             f"{flags['num']} {len(cfg.classes)} (or more), or fewer classes")
        return ids
    if cfg.classes:
        raise UsageError(f"{im.entry.ref} is text-conditional (t2i): pass caption features with {flags['captions']}, "
                         f"not {flags['classes']}")
    if not cfg.captions:
        raise UsageError(f"{im.entry.ref} is text-conditional (t2i): it needs {flags['captions']} "
                         "(precomputed T5 caption features; see docs/methods/eagle2.md)")
    captions = read_captions(cfg.captions, im.model.cfg.n_cond, im.model.cfg.caption_dim)
    return [captions[i % len(captions)] for i in range(cfg.num or len(captions))]


def conditioned(im: ImageModel, cfg_scale: float, cond: int | Caption) -> tuple[ImageParts, list[int]]:
    """Method inputs and decode prompt for one condition (class id or caption)."""
    if isinstance(cond, Caption):
        parts = im.parts(cfg_scale, cond)
        return parts, parts.target.prompt()
    return im.parts(cfg_scale), [cond]


@dataclass(frozen=True)
class ImageSample:
    """One generated image: its class (c2i) or caption index in the features file (t2i), tokens and statistics."""

    label: int
    tokens: list[int]
    stats: DecodeStats


def generate_images(im: ImageModel, req: DecodeRequest[ImageGenConfig],
                    conditions: list[int] | list[Caption] | None = None,
                    indices: list[int] | None = None, on_image=None) -> tuple[list[ImageSample], torch.Tensor]:
    """Decode the images of `conditions` (default `image_conditions(im, cfg)`); returns samples and decoded
    pixels [N, 3, H, W] in [-1, 1]. Image j samples from seed `cfg.seed * 100003 + indices[j]` (default: j), so a
    shard decoding some images of a run draws each from the seed the whole run gives it. `on_image(j, pixels)`:
    image j's pixels [3, H, W] as soon as it is decoded (each then goes through the VQ alone, not in one batch)."""
    cfg = req.cfg
    conditions = image_conditions(im, cfg) if conditions is None else conditions
    seeds = [torch.Generator().manual_seed(cfg.seed * 100_003 + i) for i in (indices or range(len(conditions)))]
    # one CFG target for every image (c2i: the class is the prompt; t2i: the prompt names a caption of the target)
    parts = im.parts(cfg.cfg_scale, list(conditions) if im.text_conditional else None)
    prompts = [parts.target.prompt(i) for i in range(len(conditions))] if im.text_conditional else \
        [[c] for c in conditions]
    budget = None
    if req.budget == "auto":  # one per method and options on this model, shared by its calls
        key = (req.method, repr(sorted(req.builder_options().items())), cfg.cfg_scale, cfg.temperature)
        if key not in im.budgets:
            im.budgets[key] = auto_budget(im, parts.target.branches, req.params.greedy)
        budget = im.budgets[key]
    rule = build_image_method(req.method, parts, req.options)[1]
    tokens: list[list[int]] = [[] for _ in conditions]  # as accepted: a finished image's tokens before the batch ends
    pixels: list[torch.Tensor] = [torch.empty(0)] * len(conditions)

    def done(j: int) -> None:
        pixels[j] = decode_pixels(im, [tokens[j]])[0]
        on_image(j, pixels[j])

    streamed = on_image is not None
    batch = run_batch(parts.target, lambda i: build_image_method(req.method, parts, req.options)[0],
                      prompts, im.grid * im.grid, req.params, (), seeds, cfg.batch_size,
                      on_done=done if streamed else None, rule=rule, max_draft=MAX_DRAFT, budget=budget,
                      on_tokens=(lambda j, new: tokens[j].extend(new)) if streamed else None)
    samples = [ImageSample(label_of(c), r.tokens, r.stats) for c, r in zip(conditions, batch.results)]
    return samples, torch.stack(pixels) if streamed else decode_pixels(im, [s.tokens for s in samples])


def auto_budget(im: ImageModel, branches: int, greedy: bool) -> MeasuredBudget:
    """`budget=auto` on `im`: the target's cost curve predicts a new batch size from a measured one (MeasuredBudget
    5.); sampled, it costs every step with the drafter's curve (its levels, in the target's unit), so the seed repeats
    the run (MeasuredBudget 6.)."""
    target = cost_of(Tokens(im.model))
    drafter = None if greedy or im.drafter_net is None else \
        relative(cost_of(DrafterForward(im.drafter_net, im.model.output)), target)
    return MeasuredBudget(MAX_DRAFT, cost=target, rows_per_sequence=branches, timed=greedy, drafter=drafter)


@torch.inference_mode()
def decode_pixels(im: ImageModel, tokens: list[list[int]]) -> torch.Tensor:
    """Pixels [N, 3, H, W] in [-1, 1] (float32, CPU) of N token grids, decoded by the VQ in one batch."""
    idx = torch.tensor(tokens).view(-1, im.grid, im.grid)
    return im.vq.decode_indices(idx.to(next(im.vq.parameters()).device)).float().clamp(-1, 1).cpu()


def label_of(condition: int | Caption) -> int:
    """An image's label: its class id (c2i) or its caption's index in the features file (t2i)."""
    return condition.index if isinstance(condition, Caption) else condition


class PngWriter:
    """PNG files in `out_dir` (made with the first), one as each image is done, then a grid: written atomically, a
    name already taken numbered (`-1`, `-2`, ...) rather than replaced."""

    def __init__(self, out_dir: Path, method: str, names: list[str]) -> None:
        self.out_dir, self.method, self.names = Path(out_dir), method, names
        self.pixels: dict[int, torch.Tensor] = {}

    def add(self, j: int, label: int, pixels: torch.Tensor) -> Path:
        """Image j's file (`pixels` [3, H, W] in [-1, 1])."""
        self.pixels[j] = pixels
        array = ((pixels.permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).byte().numpy()
        name = self.names[label] if label < len(self.names) else label
        return self.save(Image.fromarray(array), f"{self.method}-{j:03d}-{name}.png")

    def grid(self) -> Path:
        """All images so far, in order, 8 to a row."""
        return self.save(image_grid(torch.stack([self.pixels[j] for j in sorted(self.pixels)])),
                         f"{self.method}-grid.png")

    def save(self, image: Image.Image, name: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)  # checked up front (paths.check_output_dir)
        return write_linked(self.out_dir / name, lambda tmp: image.save(tmp, format="PNG"))  # a free name
