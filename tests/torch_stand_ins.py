"""CPU stand-ins for kda_aot.api.prefill, shared by the torch tests that run without a GPU.

The torch ops, chunk_kda, the FLA backend and the FlashKDA surface all look kda_aot.api.prefill
up on every call, so a test monkeypatches it with one of these:
  - StandIn computes the call with the float64 gold reference (reference.gold_prefill) rounded to
    the kernels' output dtypes, honours out= / final_state= and writes the workspace, so
    torch.library.opcheck sees the same mutations the kernels make;
  - Recording only records the arguments and returns zeros of the right shapes, for tests of what
    is passed rather than what comes back.
What they cannot check, the real kernels behind the calls, the GPU tests do.
"""

import torch

from kda_aot import reference

D = 128


gold = reference.gold_prefill  # the float64 recurrence, every gate and beta form


class StandIn:
    """api.prefill's contract on CPU tensors, computed by the gold reference; records calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, g, beta, *, A_log=None, dt_bias=None, lower_bound=None, scale=None,
                 initial_state=None, output_final_state=False, cu_seqlens=None, out=None, final_state=None,
                 workspace=None, seq_lens=None, cu_seqlens_cpu=None, cp="auto", gate="safe", beta_form="logits",
                 allow_neg_eigval=False, **rest):
        self.calls.append(dict(rest, q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
                               lower_bound=lower_bound, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens, seq_lens=seq_lens,
                               cu_seqlens_cpu=cu_seqlens_cpu, cp=cp, numerics=rest.get("numerics"), gate=gate,
                               beta_form=beta_form, allow_neg_eigval=allow_neg_eigval, out=out,
                               final_state=final_state, workspace=workspace))
        o64, s64 = gold(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, cu_seqlens, gate=gate,
                        beta_form=beta_form, allow_neg_eigval=allow_neg_eigval)
        o = q.new_empty(q.shape) if out is None else out
        o.copy_(o64)
        if workspace is not None:
            workspace.fill_(7)  # the kernels write their scratch: opcheck must see it declared
        if not output_final_state:
            return o, None
        if final_state is None:
            final_state = q.new_empty(s64.shape, dtype=torch.float32 if initial_state is None else initial_state.dtype)
        final_state.copy_(s64)
        return o, final_state


class Recording(StandIn):
    """Records api.prefill's arguments and returns zeros of the right shapes, computing nothing."""

    def __call__(self, q, k, v, g, beta, *, output_final_state=False, cu_seqlens=None, initial_state=None, **kw):
        self.calls.append(dict(kw, q=q, k=k, v=v, g=g, beta=beta, output_final_state=output_final_state,
                               cu_seqlens=cu_seqlens, initial_state=initial_state))
        N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        final = q.new_zeros((N, q.shape[2], D, D), dtype=torch.float32) if output_final_state else None
        return q.new_zeros(q.shape), final


# kda_aot.prefill's gate and beta forms, one each, with the gate parameters each one leaves out
FORMS = [
    dict(gate="safe", beta_form="logits", allow_neg_eigval=False, lower_bound=None),
    dict(gate="sigmoid", beta_form="probs", allow_neg_eigval=False, lower_bound=-8.0, A_log=None),
    dict(gate="softplus", beta_form="logits", allow_neg_eigval=True, lower_bound=None, dt_bias=None),
    dict(gate="log_decay", beta_form="probs", allow_neg_eigval=False, lower_bound=None, A_log=None, dt_bias=None),
]


def with_forms(x, form):
    """make_inputs' tensors `x` for one of FORMS: (x, gate parameters, form keywords). A log-decay g
    becomes fp32 values <= 0, probability betas fp32 values in (0, 1)."""
    x = dict(x)
    if form["gate"] == "log_decay":
        x["g"] = -torch.nn.functional.softplus(x["g"].float())
    if form["beta_form"] == "probs":
        x["beta"] = torch.sigmoid(x["beta"].float())
    params = {name: form.get(name, x[name]) for name in ("A_log", "dt_bias")}
    forms = {name: form[name] for name in ("gate", "beta_form", "allow_neg_eigval", "lower_bound")}
    return x, params, forms
