"""Train MuLo-SD's low-res GPT drafter: `image_gpt.train` on the same crops and VQ, each crop area-downscaled first."""

from __future__ import annotations

from dataclasses import dataclass

from specgen.errors import UsageError
from specgen.train import image_gpt
from specgen.train.script import run_script


@dataclass(frozen=True)
class LowresGPTTrainConfig(image_gpt.ImageGPTTrainConfig):
    """The image-GPT recipe keys plus the downscale factor r of the crops."""

    downscale: int = 2
    token_cache: str = ".notes/image_tokens_lowres"
    name: str = "image-gpt-lowres"

    def down(self) -> int:
        if self.downscale < 2:
            raise UsageError(f"downscale must be >= 2, got {self.downscale}")
        return self.downscale


def main(argv: list[str] | None = None) -> int:
    return image_gpt.main(argv, LowresGPTTrainConfig, "specgen.train.image_gpt_lowres", __doc__,
                          "recipes/tiny/image-gpt-lowres.yaml")


if __name__ == "__main__":
    raise SystemExit(run_script(main))
