"""Train MuLo-SD's low-res GPT drafter: `image_gpt.train` on the same crops and VQ, each crop area-downscaled first.

The token grids are the low-res ones `specgen.train.upsampler` pairs with the target's (same crops, same downscale).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specgen.errors import UsageError
from specgen.train import image_gpt
from specgen.train.image_gpt import ImageGPTTrainConfig
from specgen.train.script import parse_recipe, print_metrics, run_script, script_parser


@dataclass(frozen=True)
class LowresGPTTrainConfig(ImageGPTTrainConfig):
    """The image-GPT recipe keys plus the downscale factor r of the crops."""

    downscale: int = 2
    token_cache: str = ".notes/image_tokens_lowres"
    name: str = "image-gpt-lowres"


def train(cfg: LowresGPTTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
          device: str = "cpu") -> dict[str, Any]:
    """`image_gpt.train` on the crops downscaled by `cfg.downscale` (grid = G / downscale)."""
    if cfg.downscale < 2:
        raise UsageError(f"downscale must be >= 2, got {cfg.downscale}")
    return image_gpt.train(cfg, out, log, command="python -m specgen.train.image_gpt_lowres", down=cfg.downscale,
                           device=device)


def main(argv: list[str] | None = None) -> int:
    parser = script_parser("specgen.train.image_gpt_lowres", __doc__, "recipes/tiny/image-gpt-lowres.yaml")
    cfg, args, log = parse_recipe(parser, LowresGPTTrainConfig, argv)
    return print_metrics(train(cfg, Path(args.out), log, device=args.device))


if __name__ == "__main__":
    raise SystemExit(run_script(main))
