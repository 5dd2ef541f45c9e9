"""Train the low-resolution class-conditional GPT drafter of MuLo-SD with the image-GPT recipe.

    python -m specgen.train.image_gpt_lowres --config recipes/tiny/image-gpt-lowres.yaml --out RUN [key=value ...]

Exactly `specgen.train.image_gpt.train` (same objective, model family, schedule, evaluation, registration)
on the SAME crops and the SAME VQ, except that every crop is area-downscaled by `downscale` before
tokenisation: 64 x 64 crops -> 32 x 32 pixels -> 8 x 8 tokens of the tiny VQ for the 16 x 16 target. These
are the low-res token grids `specgen.train.upsampler` pairs with the 16 x 16 ones (same crops, same
downscale), so drafter and up-sampler see the same distribution. The only mechanism: the token dataset
passed to `image_gpt.train` is built here (cached under `token_cache`, keyed by the downscale too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specgen.train import image_gpt
from specgen.train.image_gpt import ImageGPTTrainConfig
from specgen.train.script import parse_recipe, print_metrics, run_script, script_parser


@dataclass(frozen=True)
class LowresGPTTrainConfig(ImageGPTTrainConfig):
    """The image-GPT recipe keys plus the downscale factor r of the crops."""

    downscale: int = 2
    token_cache: str = ".notes/image_tokens_lowres"
    name: str = "image-gpt-lowres"


def lowres_token_dataset(cfg: LowresGPTTrainConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """`image_gpt.token_dataset`'s result for crops downscaled by `cfg.downscale` (grid = G / downscale)."""
    import torch

    from specgen.data.images import IMAGE_CLASSES
    from specgen.train.upsampler import crop_tokens

    vq, doc, digest = image_gpt.load_vq(cfg.vq)
    crop = int(doc.get("image_size", 64))
    r = cfg.downscale
    if r < 2 or crop % (r * vq.config.downsample):
        raise ValueError(f"downscale {r} must be >= 2 and divide the crop {crop} into whole VQ tokens")
    key = f"vq{digest}-seed{cfg.data_seed}-crop{crop}-down{r}-train{cfg.num_crops}-eval{cfg.eval_crops}"
    path = Path(cfg.token_cache) / f"{key}.safetensors"

    def build():
        log(f"tokenising crops downscaled {r}x with VQ {cfg.vq} ({digest}) -> {path}")
        tr = crop_tokens(vq, "train", cfg.num_crops, cfg.data_seed, crop, r, log, high=False)
        ev = crop_tokens(vq, "eval", cfg.eval_crops, cfg.data_seed, crop, r, log, high=False)
        return ({"train_tokens": tr["lo"].flatten(1), "train_labels": tr["labels"],
                 "eval_tokens": ev["lo"].flatten(1), "eval_labels": ev["labels"]},
                {"classes": list(IMAGE_CLASSES), "vq_sha": digest, "grid": crop // r // vq.config.downsample,
                 "codebook_size": vq.config.codebook_size})

    t, meta = image_gpt.cached_tokens(path, build, log)
    t = {k: (v.to(torch.int16) if k.endswith("tokens") else v) for k, v in t.items()}
    return {**t, **meta, "vq_model": vq, "vq_doc": {**doc, "image_size": crop // r}}


def train(cfg: LowresGPTTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
          device: str = "cpu") -> dict[str, Any]:
    """`image_gpt.train` on the low-res token dataset."""
    return image_gpt.train(cfg, out, log, command="python -m specgen.train.image_gpt_lowres",
                           dataset=lowres_token_dataset, device=device)


def main(argv: list[str] | None = None) -> int:
    parser = script_parser("specgen.train.image_gpt_lowres", __doc__, "recipes/tiny/image-gpt-lowres.yaml")
    cfg, args, log = parse_recipe(parser, LowresGPTTrainConfig, argv)
    return print_metrics(train(cfg, Path(args.out), log, device=args.device))


if __name__ == "__main__":
    raise SystemExit(run_script(main))
