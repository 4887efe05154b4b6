"""prefill's options other than its tensors and its stream, declared once: name, default, whether it
shapes the plan, and its type in the torch operators' schemas. `CallOptions` is the frozen,
hashable record of the options that shape a plan; with the tensors' signature it is the plan
cache's key (kda_aot/api.py) and what the validation wall reads (intake/validation.check_call).

prefill's keyword defaults, the torch operators' schemas (kda_aot/_torch_ops.py) and CallOptions'
fields all come from OPTIONS; tests/cpu/test_one_source.py ties prefill's signature to it.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any, Optional, Tuple


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    plans: bool  # shapes the plan: a field of CallOptions (the others are read by the intake only)
    schema: Optional[str] = None  # its type in the torch operators' schemas; None: not an operator argument


OPTIONS: Tuple[Option, ...] = (
    Option("lower_bound", None, True, "float?"),
    Option("scale", None, True, "float?"),
    Option("output_final_state", False, True, "bool"),
    Option("cp", "auto", True, "str"),  # the operators take the named modes; prefill also an int
    Option("value_split", None, True),  # tests and benchmarks
    Option("checkpoint_every", None, True),
    Option("numerics", "flashkda", True, "str"),
    Option("gate", "safe", True, "str"),
    Option("beta_form", "logits", True, "str"),
    Option("allow_neg_eigval", False, True, "bool"),
    # host hints and checks, read by the intake (intake/arguments.py)
    Option("seq_lens", None, False, "SymInt[]?"),
    Option("cu_seqlens_cpu", None, False, "Tensor?"),
    Option("state_indices_cpu", None, False),
    Option("validate", "device", False),
)

DEFAULTS = {o.name: o.default for o in OPTIONS}
SCHEMA_TYPES = {o.name: o.schema for o in OPTIONS if o.schema is not None}
PLANNED = tuple(o.name for o in OPTIONS if o.plans)


class CallOptions(namedtuple("CallOptions", PLANNED + ("hint",),
                             defaults=tuple(DEFAULTS[n] for n in PLANNED) + (None,))):
    """The options of one call that shape its plan, by name. `hint`: the host lengths as a key,
    ("lens", ...) from seq_lens or ("cu", ...) from cu_seqlens_cpu or a read-back cu_seqlens, or None
    (intake/arguments.hint_key)."""

    __slots__ = ()

    @classmethod
    def of(cls, planned: tuple, hint) -> "CallOptions":
        """The record of a call's plan-shaping options, given in PLANNED order (prefill's body
        passes them so, intake/by_name.py), with the host hint; without keyword construction, on a
        path where a microsecond is counted (docs/call_path.md)."""
        return tuple.__new__(cls, planned + (hint,))

    def key(self) -> tuple:
        """The record with its values' types: 1, 1.0 and True compare equal in a tuple but are
        different options (the wall refuses some of them), so a plan is never found by the wrong
        one. An unhashable value raises TypeError where the key is looked up (the caller then lets
        the wall name it)."""
        return self, tuple(map(type, self))
