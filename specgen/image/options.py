"""Option names of the image methods (kept import-light: `specgen.methods` reads them at import time)."""

TREE_OPTIONS = ("depth", "top_k", "total_tokens")  # EAGLE-2 fixed tree
ADT_OPTIONS = ("beta", "l_d", "l_k", "d_min", "d_max", "k_min", "k_max", "d0", "k0", "total_tokens", "init", "seed")
LANTERN_OPTIONS = ("lantern_k", "lantern_delta")
VVS_OPTIONS = ("schedule", "interval", "threshold", "alpha", "stride", "staleness", "refresh")  # specgen.methods.vvs
MULO_OPTIONS = ("lowres", "upsampler", "tau", "radius", "rejection", "draft_rows")  # specgen.methods.mulo_sd

IMAGE_METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "eagle2": TREE_OPTIONS,
    "adt-tree": ADT_OPTIONS,
    "lantern": TREE_OPTIONS + LANTERN_OPTIONS,
    "adt-tree+lantern": ADT_OPTIONS + LANTERN_OPTIONS,
    "vvs": TREE_OPTIONS + LANTERN_OPTIONS + VVS_OPTIONS,
    "mulo-sd": MULO_OPTIONS + LANTERN_OPTIONS,
}
