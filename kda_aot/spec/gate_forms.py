"""The gate and beta forms prefill computes (docs/gate_forms.md): their names, what each needs, and
which K1 kernel prepares it. Pure Python: the validation wall, the launcher and the references
read the forms from here, and nothing else spells them.

Gate forms, per token, head and key channel (natural-log decay `log alpha`, always applied as
`S <- S Diag(alpha)`):

    safe       lower_bound * sigmoid(exp(A_log) * (g + dt_bias))   FlashKDA's recipe, lb in [-5, 0)
    sigmoid    lower_bound * sigmoid(exp(A_log) * (g + dt_bias))   any lb < 0; A_log, dt_bias optional
    softplus   -exp(A_log) * softplus(g + dt_bias)                  unbounded below; dt_bias optional
    log_decay  g itself (bf16 or fp32), computed by the caller      unbounded below

Beta forms: "logits" (b = sigmoid(beta), or 2 sigmoid(beta) with allow_neg_eigval) and "probs"
(b = beta as given), bf16 or fp32.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from ..library.constants import BETA_CODES, GATE_CODES, K1X_GATE_TAGS

GATES = tuple(gate for gate, _ in GATE_CODES)  # the build's table of forms (shared_constants.GATE_CODES)
BETA_FORMS = ("logits", "probs")
DEFAULT_LOWER_BOUND = -5.0  # FlashKDA's and FLA's recommended bound, used when lower_bound is None

# What each gate form takes: A_log and dt_bias are "required", "optional" or "absent"; lower_bound
# "safe" (in [-5, 0)), "negative" (any finite value < 0) or "absent" (must be None).
_NEEDS = {
    "safe": ("required", "required", "safe"),
    "sigmoid": ("optional", "optional", "negative"),
    "softplus": ("required", "optional", "absent"),
    "log_decay": ("absent", "absent", "absent"),
}


def needs(gate: str):
    """(A_log, dt_bias, lower_bound) rules of a gate form (see _NEEDS)."""
    return _NEEDS[gate]


class Form(NamedTuple):
    """A call's gate and beta form, once validated."""

    gate: str = "safe"
    beta_form: str = "logits"
    neg_eigval: bool = False  # b = 2 sigmoid(beta)
    g_fp32: bool = False  # log_decay with an fp32 g
    beta_fp32: bool = False

    @property
    def flashkda(self) -> bool:
        """FlashKDA's configuration, computed by the K1 whose bits equal FlashKDA's."""
        return (self.gate, self.beta_form, self.neg_eigval, self.beta_fp32) == ("safe", "logits", False, False)


FLASHKDA = Form()

def k1_gate_tag(form: Form) -> str:
    """The gate part of a general K1's name (the build's table of gate tags, K1X_GATE_TAGS): "safe"
    runs as "sigmoid" (the same formula), log_decay by its g dtype."""
    gate = "sigmoid" if form.gate == "safe" else form.gate
    g_dtype = "float32" if form.g_fp32 else "bfloat16"
    for tag, tag_gate, tag_dtype in K1X_GATE_TAGS:
        if tag_gate == gate and (tag_dtype == g_dtype or gate != "log_decay"):
            return tag
    raise ValueError(f"no general K1 for gate {form.gate!r}")


def k1_beta_tag(form: Form) -> str:
    """The beta part of a general K1's name: the beta code's name (BETA_CODES) and its dtype."""
    kind = "probs" if form.beta_form == "probs" else ("logits2" if form.neg_eigval else "logits")
    assert kind in dict(BETA_CODES), kind
    return f"{kind}_{'f32' if form.beta_fp32 else 'bf16'}"


def k1_kernel(form: Form, accurate: bool, strided: bool = False) -> str:
    """The K1 that prepares this form: FlashKDA's K1 for its configuration, else the general K1
    (docs/gate_forms.md), whose tiles take an exact path where the decay factors leave fp32's range;
    `strided`: its twin that reads q, k, g and beta at their strides (docs/api.md, "Strided inputs")."""
    acc = "_acc" if accurate else ""
    suffix = "_strided" if strided else ""
    if form.flashkda:
        return f"k1_prepare{acc}{suffix}"
    return f"k1x_{k1_gate_tag(form)}_{k1_beta_tag(form)}{acc}{suffix}"


def resolve_lower_bound(gate: str, lower_bound: Optional[float]) -> Optional[float]:
    """lower_bound as the kernels use it: the default for the sigmoid forms, None otherwise."""
    if needs(gate)[2] == "absent":
        return None
    return DEFAULT_LOWER_BOUND if lower_bound is None else lower_bound
