"""The numbers both wings must agree on: head dimension, tile size, K2 value blocks, workspace slots.

Defined here, on the build side, and carried to the runtime one way: `python -m build_kernels.abi
--write` renders them into kda_aot/library/_abi.py beside the kernel signatures, and kda_aot/library/constants.py
reads them from there (a CPU test and `--check` keep the generated file fresh). The build writes
manifest_constants() into the manifest, and kda_aot.library.identity refuses a library whose manifest says
otherwise: a library compiled with another tile or slot size would read the workspace wrongly.
Stdlib only.
"""

from __future__ import annotations

from typing import Any, Dict

# Manifest format the build writes and identity.py reads (3: adds the "constants" section).
MANIFEST_FORMAT = 3

D = 128  # head dimension, K = V = 128 only (docs/algorithm.md §1.4)
CHUNK = 16  # tokens per tile (docs/algorithm.md §2.3); the 16x16 inverse and the gate range argument rely on it
LOG2E = 1.4426950408889634  # log2(e): the gates run in base 2 (docs/algorithm.md §2.4 P2), both wings use it
VALUE_BLOCKS = (128, 64, 32)  # value rows of the state per K2 / pre_scan CTA (the value-column split)

WORKSPACE_ALIGN = 256  # every workspace region starts 256-byte aligned relative to the base
TILE_IMAGE_BYTES = CHUNK * D * 2  # one raw 16x128 bf16 tile image (docs/kernel_abi.md)

# Bytes per (head, tile) slot of each workspace region, in the order the regions are laid out
# (docs/kernel_abi.md): K1 writes them, K2 and pre_scan copy them into their stages.
SLOT_BYTES = (
    ("qd", TILE_IMAGE_BYTES),  # 4096: raw image of Qd
    ("kd", TILE_IMAGE_BYTES),  # 4096: raw image of Kd
    ("kr", TILE_IMAGE_BYTES),  # 4096: raw image of Kr
    ("gt", D * 4),  # 512: fp32 gamma per key channel
    ("inv", CHUNK * CHUNK * 2),  # 512: bf16 (I+L)^-1, 16x16
    ("mqk", CHUNK * CHUNK * 2),  # 512: bf16 causal Qd Ki^T, 16x16
    # 64: two planes of bf16 per row, each [heads x tiles] slots of 32 bytes: sigma(beta) at
    # slot * 32, then (numerics="accurate" only) its residue bf(sigma - bf(sigma)) at
    # (heads * tile capacity + slot) * 32, so that the accurate kernels use sigma to 16 bits
    ("bsig", 2 * CHUNK * 2),
)
BSIG_PLANE_BYTES = CHUNK * 2  # one slot of one bsig plane: 16 bf16
SLOT = dict(SLOT_BYTES)

STATE_BYTES = D * D * 4  # one fp32 [V, K] state: the CP scratch per (segment, head)
MAX_SLOTS = 256  # argument slots of one native call (program.py builds them, the shim's kda_run holds them)


# Value blocks the register-state K2 exists at (build_kernels/kernels/k2_regstate.py: a warpgroup
# per 64 value columns): the registry builds a twin of every K2 variant at these, and the kernel
# accepts no other; the planner picks the twin at exactly these (kda_aot/plan/planner.py k2_kernel).
REGSTATE_VALUE_BLOCKS = (64, 128)

# The register-state twin of a K2 variant (same arguments, same bits) is named k2_X -> k2_regstate_X:
# the registry names the twins with it (the runtime looks kernels up by entry and constants).
REGSTATE_RENAME = ("k2_", "k2_regstate_")


def regstate_name(k2_name: str) -> str:
    """The kernel name of the register-state twin of the K2 variant `k2_name`."""
    return k2_name.replace(*REGSTATE_RENAME, 1)


# The gate and beta forms K1 compiles (docs/gate_forms.md), each with its code: the compile-time
# constant K1 branches on (gate_form, beta_form; tile_prep.py), the variants' names
# (build_kernels/registry.py, k1x_<gate tag>_<beta>_<beta dtype>) and the runtime's choice of K1
# (kda_aot/spec/gate_forms.py) all read this one table. Gate 0 is FlashKDA's configuration, which
# the general K1 computes as "sigmoid" (the same formula). A gate tag names a general K1's gate and
# its g dtype (log_decay takes g in bf16 or fp32; the other gates read a bf16 g).
GATE_CODES = (("safe", 0), ("sigmoid", 1), ("softplus", 2), ("log_decay", 3))
BETA_CODES = (("logits", 0), ("logits2", 1), ("probs", 2))  # logits2: 2 sigmoid(beta) (allow_neg_eigval)
K1X_GATE_TAGS = (("sigmoid", "sigmoid", "bfloat16"), ("softplus", "softplus", "bfloat16"),
                 ("logdecay_bf16", "log_decay", "bfloat16"), ("logdecay_f32", "log_decay", "float32"))
# What each gate form takes, in GATE_CODES' order (the runtime's validation wall reads it through
# kda_aot/spec/gate_forms.py): A_log and dt_bias "required", "optional" or "absent"; lower_bound
# "safe" (in [-5, 0)), "negative" (any finite value < 0) or "absent" (must be None).
GATE_NEEDS = (("safe", "required", "required", "safe"), ("sigmoid", "optional", "optional", "negative"),
              ("softplus", "required", "optional", "absent"), ("log_decay", "absent", "absent", "absent"))


# What kda_aot/library/_abi.py carries to the runtime (build_kernels/abi.py renders them), in this order.
RUNTIME_NAMES = ("MANIFEST_FORMAT", "D", "CHUNK", "LOG2E", "VALUE_BLOCKS", "WORKSPACE_ALIGN", "TILE_IMAGE_BYTES",
                 "SLOT_BYTES", "STATE_BYTES", "MAX_SLOTS", "REGSTATE_VALUE_BLOCKS", "GATE_CODES", "BETA_CODES",
                 "K1X_GATE_TAGS", "GATE_NEEDS")


def manifest_constants() -> Dict[str, Any]:
    """The constants as the manifest records them (JSON types: lists, not tuples), so that
    a manifest read back compares equal to this."""
    return {
        "D": D,
        "CHUNK": CHUNK,
        "VALUE_BLOCKS": list(VALUE_BLOCKS),
        "WORKSPACE_ALIGN": WORKSPACE_ALIGN,
        "SLOT_BYTES": [[name, nbytes] for name, nbytes in SLOT_BYTES],
        "STATE_BYTES": STATE_BYTES,
    }
