"""A decode request: a generate config with its method looked up once and its options validated once."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Generic, TypeVar

from specgen.decoding.sampling import SamplingParams
from specgen.devices import device_name, on_gpu
from specgen.errors import UsageError
from specgen.methods import MethodSpec, get_method
from specgen.methods.options import BUDGET_DEFAULT
from specgen.models.graphs import check_mode
from specgen.precision import resolve

C = TypeVar("C")  # a modality's recipe config (TextGenConfig, ImageGenConfig, MeshGenConfig)


@dataclass(frozen=True)
class DecodeRequest(Generic[C]):
    """What every layer below a command reads: the recipe as loaded (ranges checked by `load_config`), the method's
    spec and typed options, the sampling params and the resolved device; nothing below checks them again."""

    cfg: C
    spec: MethodSpec
    options: Any  # an instance of spec.options_type
    params: SamplingParams
    device: str

    @property
    def method(self) -> str:
        return self.spec.name

    @property
    def budget(self) -> str:
        """The loop's draft budget (`fixed` | `auto`); methods without the option run `fixed`."""
        return asdict(self.options).get("budget", BUDGET_DEFAULT)

    def model_label(self, ref: str) -> str:
        """`ref` (the loaded entry's) as `--model` names these weights: `+int8`, `+bfloat16`, ... when not float32
        (image and mesh GPTs take their precision at load, so their entry's name does not say it)."""
        precision = self.cfg.quantize or (self.cfg.dtype if self.cfg.dtype not in (None, "float32") else None)
        return f"{ref}+{precision}" if precision else ref

    def with_cfg(self, **changes: Any) -> DecodeRequest[C]:
        """The same method and options over the config with `changes` (a benchmark's temperatures, seeds, sizes)."""
        cfg = replace(self.cfg, **changes)
        return replace(self, cfg=cfg, params=SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p))

    def builder_options(self) -> dict[str, Any]:
        """The options as a plain dict without the loop's `budget` and unset values: the method's settings as a key."""
        return {k: v for k, v in asdict(self.options).items() if k != "budget" and v is not None}


#: modalities whose GPT takes its precision at load (text makes a derived registry entry of `NAME+int8` instead)
IN_MEMORY_PRECISION = ("image", "mesh")


def parse_request(cfg: C, modality: str, spec: MethodSpec | None = None) -> DecodeRequest[C]:
    """`cfg` (a loaded recipe config) as a request for `modality`; `spec`: the method if already looked up."""
    spec = spec or get_method(cfg.method)
    if not spec.runs_on(modality):
        raise UsageError(f"method {spec.name} is for {spec.modality} models, not {modality} ones")
    if modality in IN_MEMORY_PRECISION and "+" in (cfg.model or ""):  # `NAME+int8`, as text takes it: NAME, int8
        base, dtype, quantize = resolve(cfg.model, cfg.dtype, cfg.quantize)  # an option contradicting it: refused
        cfg = replace(cfg, model=base, dtype=dtype, quantize=quantize)
    device = device_name(cfg.device)
    options = spec.parse_options(cfg.method_options, gpu=on_gpu(device))
    params = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    options.check_use(modality, params.greedy)
    check_mode(cfg.graphs, device)  # before any model loads
    return DecodeRequest(cfg, spec, options, params, device)
