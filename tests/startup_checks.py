"""One fresh interpreter answers every start-up check of the suite in turn (each launch pays torch's import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer, models

ROOT = Path(__file__).resolve().parents[1]

# The order keeps each answer a fresh interpreter's: sys.modules only grows, so a module an earlier step loaded can
# only make a later "not loaded" check fail, never pass. Each control runs after every check on its module and
# records that module absent just before it (no earlier step made the control pass). The scripts' imports load
# everything, so they come last. The reader of each answer is named at its step.
SCRIPT = """
import gc, glob, importlib.util, json, pathlib, sys
tokenizer_folder, stale_folder, answers, tiled = sys.argv[1:]
out = {}
from cli._process import imports_frozen  # tests/cli/test_process.py: the first import of torch is frozen
with imports_frozen():
    off = not gc.isenabled()
    import torch
out["frozen"] = [off, gc.isenabled(), gc.get_freeze_count() > 100_000]

import specgen.registry  # tests/test_layers.py: the registry loads alone
out["registry"] = sorted(m for m in sys.modules if m.startswith("specgen"))

from specgen.models.tokenizer import TextTokenizer  # tests/text/test_tokenizer.py: it renders without transformers
out["tokenizer"] = [TextTokenizer.load(tokenizer_folder).encode("a"), "transformers" in sys.modules]

import cli.generate_runners  # tests/test_layers.py: no modality stack until one is picked
out["stacks"] = sorted(m for m in ("cli.generate_text", "cli.generate_image", "cli.generate_mesh", "trimesh",
                                   "matplotlib") if m in sys.modules)

from specgen.builders import BUILDERS  # tests/test_layers.py: the meta builds import no dynamo
from specgen.models.unfilled import random_fills_skipped
out["dynamo"] = ["torch._dynamo" in sys.modules]
for path in sorted(glob.glob("specgen/assets/**/config.json", recursive=True)):
    meta = json.load(open(path))
    if meta.get("builder") in BUILDERS:
        with torch.device("meta"), random_fills_skipped():
            BUILDERS[meta["builder"]](**meta.get("kwargs", {}))
from specgen.models.quantize import quantized_layers  # an int4 load's build (SmolLM2's shape), and the kernel
smollm2 = dict(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536)  # operands that a
with random_fills_skipped():  # cached file matches
    quantized = BUILDERS["quantized-transformer"]("int4", 32, **smollm2)
for lin in quantized_layers(quantized).values():
    lin.make_kernel("meta")
out["dynamo"].append("torch._dynamo" in sys.modules)

if tiled == "1":  # tests/models/test_tiled_weight.py (a build with tiled.c and oneDNN): a load and a decode step
    from torch import nn  # on tiles import no torch.distributed
    from specgen.models.packed_linear import PackedLinear
    from specgen.models.tiled_weight import TiledWeight
    w = torch.randn(40, 24)
    lin = nn.Linear(24, 40)
    lin.weight = TiledWeight.of(w)
    lin.load_state_dict({"weight": w, "bias": torch.zeros(40)})
    lin.__class__ = PackedLinear
    with torch.inference_mode():
        assert torch.equal(nn.functional.embedding(torch.tensor([3]), lin.weight), w[[3]])
        lin(torch.randn(2, 24)), lin.state_dict()
    out["distributed"] = ["torch.distributed.tensor" in sys.modules]
    with torch.inference_mode():  # its control, after every check on the module
        lin.weight + 1  # an op only the dense fallback answers: torch's Python dispatch runs
    out["distributed"].append("torch.distributed.tensor" in sys.modules)

# the dynamo control, after every check on the module
out["dynamo"].append("torch._dynamo" in sys.modules)
2.0 ** torch.arange(3, device="meta")  # a meta op with a Python meta kernel
out["dynamo"].append("torch._dynamo" in sys.modules)

out["scripts"] = []  # tests/test_scripts.py: every script imports; the stale one's folder is read after scripts/
for folder in map(pathlib.Path, ("scripts", stale_folder)):
    sys.path.insert(0, str(folder))  # scripts import their neighbours by name
    for path in sorted(folder.glob("*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        sys.modules[path.stem] = module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)  # a script's work runs under `__main__` only
        except Exception as e:
            out["scripts"].append(f"{folder.name}/{path.name}: {type(e).__name__}: {e}")
json.dump(out, open(answers, "w"))
"""


def answers(folder: Path, tiled: bool) -> dict[str, list]:
    """Run SCRIPT in a fresh interpreter (working files in `folder`; the tiled-weight step where `tiled`, as this
    build has tiled.c and oneDNN): each step's answer by name."""
    tokenizer = folder / "tokenizer"  # a one-word vocabulary whose template needs jinja2's loop controls
    tokenizer.mkdir()
    Tokenizer(models.WordLevel({"a": 0, "?": 1}, unk_token="?")).save(str(tokenizer / "tokenizer.json"))
    template = "{{ messages[0]['content'] }}{% for m in messages %}{% break %}{% endfor %}"
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"eos_token": "?", "chat_template": template}))
    stale = folder / "stale"  # the scripts' control: a script importing a name that went
    stale.mkdir()
    (stale / "stale.py").write_text("from specgen.decoding.loop import no_such_name\n")
    out = folder / "answers.json"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tokenizer), str(stale), str(out), "1" if tiled else "0"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())
