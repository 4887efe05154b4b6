"""A public entry point whose parameters are handed on by the tables' names, at the cost of a
hand-written tuple.

prefill takes 35 parameters and hands them on as a few tuples whose order the tables keep
(prefill_args' tensors, call_options' plan-shaping options). Reading them by name on every call
(`locals()` and `operator.itemgetter`) costs 0.9 us more per call than tuples written out in the
function body on CPython 3.11 and 1.1-2.2 us on the H200's 3.12 (docs/design.md, "prefill reads its
arguments by name"): only compiled code builds a tuple from the fast locals. So the body is
compiled once, at import, from the names: `reads_by_name(call, *groups)` turns a `def` that holds
the public signature and docstring into a function with that signature whose body is

    return call((q, k, ...), (lower_bound, ...), stream, ...)

each tuple spelled from a table's names, never by hand (collections.namedtuple and dataclasses
build their methods the same way). A parameter that no group names is an import-time error, so a
new argument cannot be dropped silently.
"""

from __future__ import annotations

import functools
import inspect
import linecache
from typing import Callable, Sequence, Tuple, Union

Group = Union[str, Sequence[str]]  # one parameter's value, or a tuple of the named parameters' values


def reads_by_name(call: Callable, *groups: Group, unused: Tuple[str, ...] = ()) -> Callable:
    """Decorator: the decorated function's signature, docstring and annotations, with a body that
    calls `call` with one argument per group (a name: that parameter; a sequence of names: the
    tuple of those parameters, in that order). Every parameter must be named by a group or listed
    in `unused` (accepted and ignored)."""

    def compile_body(template: Callable) -> Callable:
        params = inspect.signature(template).parameters
        named = {name for group in groups for name in ((group,) if isinstance(group, str) else group)}
        unknown = sorted((named | set(unused)) - set(params))
        if unknown:
            raise TypeError(f"{template.__qualname__}: no parameter named {', '.join(unknown)}")
        unread = [name for name in params if name not in named and name not in unused]
        if unread:
            raise TypeError(f"{template.__qualname__}: parameters {', '.join(unread)} are neither read nor unused")
        source = _source(template.__name__, params.values(), groups)
        filename = f"<kda_aot: {template.__module__}.{template.__qualname__}, body compiled by intake/by_name.py>"
        namespace = {"_call": call}
        namespace.update({f"_default_{p.name}": p.default for p in params.values()
                          if p.default is not inspect.Parameter.empty})
        exec(compile(source, filename, "exec"), namespace)
        # tracebacks (and inspect.getsource) show the compiled body's two lines
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        function = functools.update_wrapper(namespace[template.__name__], template)
        # The template's body never runs: no __wrapped__ that inspect.unwrap would hand out to call.
        # The compiled def has the template's parameters, so its own signature is the template's.
        del function.__wrapped__
        return function

    return compile_body


def _source(name: str, params, groups: Sequence[Group]) -> str:
    rendered, keyword_only = [], False
    for p in params:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"{name}: parameter {p.name} is {p.kind.description}; only named parameters are read")
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            rendered.append("*")
            keyword_only = True
        rendered.append(p.name if p.default is p.empty else f"{p.name}=_default_{p.name}")
    args = [group if isinstance(group, str) else "(" + "".join(f"{n}, " for n in group) + ")" for group in groups]
    return f"def {name}({', '.join(rendered)}):\n    return _call({', '.join(args)})\n"
