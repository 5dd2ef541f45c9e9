"""`specgen generate`'s runs: the method looked up once, its modality's runner picked, another modality's flags refused."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from cli._options import Format, recipe_key
from specgen import checkpoints
from specgen.errors import UsageError
from specgen.methods import get_method
from specgen.precision import split_name


@dataclass(frozen=True)
class GenerateArgs:
    """What the user passed to `generate`, as given: each modality's runner loads its recipe config from it."""

    recipe: dict  # the recipe keys every modality shares (model, sampling, device, ...; None: the recipe's or default)
    prompts: list[str]
    prompts_file: str | None
    prompt_field: str | None
    max_new_tokens: int | None
    chat: bool | None
    config: Path | None
    overrides: list[str]
    fmt: Format
    quiet: bool
    out_dir: Path | None
    num: int | None
    classes: str | None
    cfg_scale: float | None
    point_clouds: Path | None
    captions: Path | None
    drafter: str | None
    stream: bool | None  # None: not given (another modality's flag is refused only when given)
    stop: list[str] | None  # stop strings (None: not given)


#: GenerateArgs field -> (its flag, the modalities that read it); another modality's option is refused, not ignored
MODALITY_OPTIONS = {
    "prompts": ("--prompt", ("text",)), "prompts_file": ("--prompts", ("text",)),
    "prompt_field": ("--prompt-field", ("text",)), "chat": ("--no-chat", ("text",)),
    "stream": ("--stream", ("text",)), "stop": ("--stop", ("text",)), "point_clouds": ("--point-clouds", ("mesh",)),
    "max_new_tokens": ("--max-new-tokens", ("text", "mesh")), "out_dir": ("--out-dir", ("image", "mesh")),
    "num": ("--num", ("image", "mesh")), "classes": ("--classes", ("image",)), "cfg_scale": ("--cfg-scale", ("image",)),
    "captions": ("--captions", ("image",)), "drafter": ("--drafter", ("image",)),
}
#: (field, modality) -> what that modality uses instead, added to the refusal
INSTEAD = {("drafter", "mesh"): "; XSpecMesh heads are method_options.heads=NAME"}
#: modality -> its runner module (`run(args, spec)`), imported on use: a text run loads no image or mesh stack
RUNNERS = {"text": "cli.generate_text", "image": "cli.generate_image", "mesh": "cli.generate_mesh"}


def run(args: GenerateArgs, method: str) -> None:
    spec = get_method(method)  # the one lookup of the method
    # the model as the config will load it (--model, else an override, else the recipe file's): its modality picks
    # the runner, so `model=NAME` or a recipe's `model:` runs the same runner as --model NAME
    model = args.recipe["model"] or recipe_key(args.config, args.overrides, "model")
    given = [field for field in MODALITY_OPTIONS if getattr(args, field) not in (None, [])]
    modality = checkpoints.modality_of(split_name(model)[0]) if model else unnamed_modality(spec, given)  # NAME+int8
    for field in given:
        flag, modalities = MODALITY_OPTIONS[field]
        if modality not in modalities:
            raise UsageError(f"{flag} is for {' and '.join(modalities)} models; this is {article(modality)} {modality} "
                             f"model{INSTEAD.get((field, modality), '') or name_one(spec, model, modalities)}")
    importlib.import_module(RUNNERS[modality]).run(args, spec)


def unnamed_modality(spec, given: list[str]) -> str:
    """The modality of a run that names no model (its modality's default model decodes): the method's own, unless
    the method runs on several and the options given are read by just one other of them (`ar --classes dog`:
    images, where it refused --classes as a text run's)."""
    fits = [m for m in spec.modalities or (spec.modality,) if all(m in MODALITY_OPTIONS[f][1] for f in given)]
    return fits[0] if len(fits) == 1 else spec.modality


def name_one(spec, model: str | None, modalities: tuple[str, ...]) -> str:
    """How a refused option's modality is reached when the method runs on it but no model was named."""
    runs = [m for m in modalities if spec.runs_on(m)]
    return "" if model or not runs else (f"; {spec.name} decodes the default {spec.modality} model unless --model "
                                         f"names {article(runs[0])} {' or '.join(runs)} one")


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"
