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

from ..library.constants import BETA_CODES, GATE_CODES, GATE_NEEDS, K1X_GATE_TAGS, kernel

GATES = tuple(gate for gate, _ in GATE_CODES)  # the build's table of forms (shared_constants.GATE_CODES)
_GATE, _BETA = dict(GATE_CODES), dict(BETA_CODES)
_G_DTYPES = {(gate, g_dtype) for _, gate, g_dtype in K1X_GATE_TAGS}  # the g dtypes each general K1 gate reads
BETA_FORMS = ("logits", "probs")
DEFAULT_LOWER_BOUND = -5.0  # FlashKDA's and FLA's recommended bound, used when lower_bound is None

# What each gate form takes (the build's table, shared_constants.GATE_NEEDS): A_log and dt_bias
# "required", "optional" or "absent"; lower_bound "safe" (in [-5, 0)), "negative" or "absent".
_NEEDS = {gate: tuple(rules) for gate, *rules in GATE_NEEDS}


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

def k1_kernel(form: Form, accurate: bool, strided: bool = False) -> str:
    """The K1 that prepares this form: FlashKDA's K1 for its configuration, else the general K1
    (docs/gate_forms.md), whose tiles take an exact path where the decay factors leave fp32's range;
    `strided`: its twin that reads q, k, g and beta at their strides (docs/api.md, "Strided inputs").
    Looked up by the form's codes (the build's table, GATE_CODES and BETA_CODES) and its g and beta
    dtypes; the general K1 computes "safe" as "sigmoid" (the same formula)."""
    if form.flashkda:
        return kernel("k1_prepare", accurate=accurate, gate_form=_GATE["safe"], beta_form=_BETA["logits"],
                      g_fp32=False, strided=strided)
    gate = "sigmoid" if form.gate == "safe" else form.gate
    beta = "probs" if form.beta_form == "probs" else ("logits2" if form.neg_eigval else "logits")
    g_fp32 = form.g_fp32 and (gate, "float32") in _G_DTYPES  # an fp32 g where the gate takes one (log_decay)
    return kernel("k1_prepare", {"g": "float32" if g_fp32 else "bfloat16",
                                 "beta": "float32" if form.beta_fp32 else "bfloat16"},
                  accurate=accurate, gate_form=_GATE[gate], beta_form=_BETA[beta], g_fp32=g_fp32, strided=strided)


def resolve_lower_bound(gate: str, lower_bound: Optional[float]) -> Optional[float]:
    """lower_bound as the kernels use it: the default for the sigmoid forms, None otherwise."""
    if needs(gate)[2] == "absent":
        return None
    return DEFAULT_LOWER_BOUND if lower_bound is None else lower_bound
