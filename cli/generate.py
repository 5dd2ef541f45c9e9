"""`specgen generate`: decode with any method; the method's modality picks the runner (text, image, mesh)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli._errors import command
from cli._options import (ConfigOpt, DeviceOpt, DtypeOpt, Format, FormatOpt, GraphsOpt, MethodOpt, ModelOpt,
                          OverridesArg, PromptFieldOpt, QuantizeOpt, QuietOpt, SeedOpt, in_path, out_path,
                          prompt_source, prompt_text, recipe_key)
from cli._process import imports_frozen

EPILOG = """examples:

  specgen generate --prompt "Write a function that reverses a string."

  specgen generate --method ngram --prompts prompts.txt --format json | jq .completion

  specgen generate --method ngram --prompts prompts.txt --batch-size 16 method_options.budget=fixed

  echo "Sort a list in Python" | specgen generate --method jacobi --prompts - method_options.block_size=4

  specgen generate --no-chat --prompt "def fib(n):" --stop $'\\ndef ' --stop $'\\n\\n\\n'

  specgen generate --config recipes/tiny/generate-text.yaml --prompt "Sort a list." max_new_tokens=64

  specgen generate --method adt-tree                      # embedded image generator -> ./specgen-images

  specgen generate --method lantern --classes chelsea,coffee --num 4 --cfg-scale 3 -o out/ --format json

  specgen generate --method adt-tree --model llamagen-t2i-xl --captions feats.safetensors --cfg-scale 7.5

  specgen generate --method xspecmesh --num 2 -o meshes/ preview=true mesh_format=glb   # procedural test clouds

  specgen generate --method xspecmesh --point-clouds clouds/ -o meshes/ method_options.criterion=topk

  specgen generate --method ar --point-clouds chair.obj -o meshes/     # no --model: the options pick the modality
"""


@command
def generate(
    overrides: OverridesArg = None,
    method: MethodOpt = None,
    model: ModelOpt = None,
    prompt: Annotated[Optional[list[str]], typer.Option(
        "--prompt", "-p", parser=prompt_text, help="\\[text] Prompt text (repeatable; blank is refused).")] = None,
    prompts: Annotated[Optional[str], typer.Option(
        "--prompts", parser=prompt_source,
        help="\\[text] Prompt file as `benchmark --prompts` reads it: one per line, JSON Lines (prompt or "
                          "chat messages; Spec-Bench's turns), - for stdin, or a local dataset.")] = None,
    prompt_field: PromptFieldOpt = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", help="\\[text, mesh] Token budget per sequence (text: 128; mesh: 0 = twice the "
                                 "backbone's training length).")] = None,
    temperature: Annotated[Optional[float], typer.Option(
        "--temperature", "-t", help="Sampling temperature, 0 = greedy (default: text 0, image 1, mesh 0.5).")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens and any tied with "
                                                 "the k-th (0 = off; --temperature 0 is greedy).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass in (0, 1].")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(
        "--stop", help="\\[text] Stop string (repeatable; recipe key stop): a completion ends where the first one "
                       "appears, cut before it (its token ids end with the one that completes it); a line break is "
                       "--stop $'\\n' in bash. Streamed text holds back what may begin one.")] = None,
    no_chat: Annotated[bool, typer.Option(
        "--no-chat", help="\\[text] Feed text prompts raw, without the chat template (chat messages always use "
                          "it).")] = False,
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out-dir", "-o", parser=out_path, help="\\[image, mesh] Output folder; files already there are kept (new "
                                                 "names get -1, -2, ...).")] = None,
    num: Annotated[Optional[int], typer.Option(
        "--num", "-n", help="\\[image, mesh] Number of images (default 8, or one per caption) or of procedural test "
                            "meshes (default 4; not with --point-clouds); >= 1.")] = None,
    classes: Annotated[Optional[str], typer.Option(
        "--classes", help="\\[image] Comma-separated class names or ids, cycled over the --num images, at most "
                          "--num of them (default: every class in turn).")] = None,
    cfg_scale: Annotated[Optional[float], typer.Option(
        "--cfg-scale", help="\\[image] Classifier-free guidance scale in (0, 50]; 1 = none (default 4).")] = None,
    captions: Annotated[Optional[Path], typer.Option(
        "--captions", parser=in_path,
        help="\\[image, t2i] Caption features: .safetensors/.npz with features [N, L<=120, C] and mask "
                           "[N, L], or .npy (precomputed T5 features).")] = None,
    drafter: Annotated[Optional[str], typer.Option(
        "--drafter", help="\\[image] EAGLE drafter for eagle2/adt-tree/lantern/vvs (default: the target's shipped one).")] = None,
    point_clouds: Annotated[Optional[Path], typer.Option(
        "--point-clouds", parser=in_path,
        help="\\[mesh] Inputs, each decoded once: .npy points+normals [N, 6] (or a batch [B, N, 6]), a face-less .ply "
             "with normals, a mesh (.obj/.ply/.stl/.off/.glb) sampled to a cloud, or a folder of them (default: "
             "--num procedural test meshes).")] = None,
    batch_size: Annotated[Optional[int], typer.Option(
        "--batch-size", "-b", help="Sequences decoded together: prompts, images or point clouds (continuous "
                                   "batching; clamped to their number).")] = None,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    graphs: GraphsOpt = None,
    dtype: DtypeOpt = None,
    quantize: QuantizeOpt = None,
    stream: Annotated[bool, typer.Option(
        "--stream", help='\\[text] Completions on stdout as JSON lines {"row": i, "text": piece} as tokens are '
                         "accepted (a speculative step's run at once); the pieces of a row, joined, are its "
                         "completion. Without it a terminal gets the text itself as it is accepted, in prompt "
                         "order; a pipe gets each completion whole.")] = False,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
) -> None:
    """Generate with a decoding method; lossless methods give exactly the target's output."""
    with imports_frozen():  # their objects are never scanned by the cyclic collector (cli/_process.py)
        # deferred: start-up (the method table and the runners import torch; `specgen --help` does without them)
        from cli.generate_runners import GenerateArgs, run

    recipe = dict(model=model, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, device=device,
                  batch_size=batch_size, dtype=dtype, quantize=quantize, graphs=graphs)
    args = GenerateArgs(recipe, list(prompt or []), prompts, prompt_field, max_new_tokens, False if no_chat else None,
                        config, list(overrides or []), fmt, quiet, out_dir, num, classes, cfg_scale, point_clouds,
                        captions, drafter, stream or None, stop or None)
    named = recipe_key(config, overrides, "method")  # "" is no method (refused), not the default
    run(args, method if method is not None else named if named is not None else "ar")
