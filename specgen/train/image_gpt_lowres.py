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

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specgen.train.script import file_logger
from specgen.train import image_gpt
from specgen.train.image_gpt import ImageGPTTrainConfig


@dataclass(frozen=True)
class LowresGPTTrainConfig(ImageGPTTrainConfig):
    """The image-GPT recipe keys plus the downscale factor r of the crops."""

    downscale: int = 2
    token_cache: str = ".notes/image_tokens_lowres"
    name: str = "tiny-image-gpt-lowres"


def lowres_token_dataset(cfg: LowresGPTTrainConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """`image_gpt.token_dataset`'s result for crops downscaled by `cfg.downscale` (grid = G / downscale)."""
    import torch
    from safetensors.torch import load_file, save_file

    from specgen.train.upsampler import crop_tokens

    vq, doc, digest = image_gpt.load_vq(cfg.vq)
    crop = int(doc.get("image_size", 64))
    r = cfg.downscale
    if r < 2 or crop % (r * vq.config.downsample):
        raise ValueError(f"downscale {r} must be >= 2 and divide the crop {crop} into whole VQ tokens")
    key = f"vq{digest}-seed{cfg.data_seed}-crop{crop}-down{r}-train{cfg.num_crops}-eval{cfg.eval_crops}"
    path = Path(cfg.token_cache) / f"{key}.safetensors"
    if path.is_file():
        t = load_file(str(path))
        meta = json.loads(path.with_suffix(".json").read_text())
        log(f"token cache hit: {path}")
    else:
        log(f"tokenising crops downscaled {r}x with VQ {cfg.vq} ({digest}) -> {path}")
        tr = crop_tokens(vq, "train", cfg.num_crops, cfg.data_seed, crop, r, log, high=False)
        ev = crop_tokens(vq, "eval", cfg.eval_crops, cfg.data_seed, crop, r, log, high=False)
        t = {"train_tokens": tr["lo"].flatten(1), "train_labels": tr["labels"],
             "eval_tokens": ev["lo"].flatten(1), "eval_labels": ev["labels"]}
        from specgen.data.images import IMAGE_CLASSES

        meta = {"classes": list(IMAGE_CLASSES), "vq_sha": digest, "grid": crop // r // vq.config.downsample,
                "codebook_size": vq.config.codebook_size}
        image_gpt.atomic_write(path, lambda p: save_file({k: v.contiguous() for k, v in t.items()}, p))
        path.with_suffix(".json").write_text(json.dumps(meta))
    t = {k: (v.to(torch.int16) if k.endswith("tokens") else v) for k, v in t.items()}
    return {**t, **meta, "vq_model": vq, "vq_doc": {**doc, "image_size": crop // r}}


def train(cfg: LowresGPTTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """`image_gpt.train` with the low-res token dataset (restored afterwards)."""
    original = image_gpt.token_dataset
    image_gpt.token_dataset = lowres_token_dataset  # the one hook: what `train` tokenises
    try:
        return image_gpt.train(cfg, out, log, command="python -m specgen.train.image_gpt_lowres")
    finally:
        image_gpt.token_dataset = original


def main(argv: list[str] | None = None) -> int:
    from specgen.config import load_config

    parser = argparse.ArgumentParser(prog="python -m specgen.train.image_gpt_lowres", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="YAML recipe, e.g. recipes/tiny/image-gpt-lowres.yaml")
    parser.add_argument("--out", required=True, help="run directory (resumed if it holds state.safetensors)")
    parser.add_argument("--log", default=None, help="log file (default: OUT/train.log); also echoed to stderr")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of recipe keys")
    args = parser.parse_args(argv)
    cfg = load_config(LowresGPTTrainConfig, args.config, args.overrides)
    log_path = Path(args.log) if args.log else Path(args.out) / "train.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)

    log = file_logger(log_path)

    metrics = train(cfg, Path(args.out), log)
    print(json.dumps({k: v for k, v in metrics.items() if k != "history"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
