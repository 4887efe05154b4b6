"""intake/by_name.py: the compiled body hands on each group as named, keeps the template's face,
and refuses a parameter no group reads."""

import inspect

import pytest

from kda_aot.intake.by_name import reads_by_name


def _record(*args):
    return args


@reads_by_name(_record, ("b", "a", "c"), "d", ("e",))
def entry(a, b, *, c=3, d="four", e=None):
    """The template's docstring."""


def test_groups_are_handed_on_in_the_named_order():
    assert entry(1, 2) == ((2, 1, 3), "four", (None,))
    assert entry(1, b=2, e=5, c=[6]) == ((2, 1, [6]), "four", (5,))


def test_the_template_face_is_kept():
    assert entry.__name__ == "entry" and entry.__doc__ == "The template's docstring."
    assert str(inspect.signature(entry)) == "(a, b, *, c=3, d='four', e=None)"
    assert inspect.unwrap(entry) is entry  # the template, whose body never runs, is not handed out
    assert "return _call((b, a, c, ), d, (e, ))" in inspect.getsource(entry)
    with pytest.raises(TypeError, match=r"entry\(\) missing 1 required positional argument: 'b'"):
        entry(1)
    with pytest.raises(TypeError, match=r"entry\(\) got an unexpected keyword argument 'f'"):
        entry(1, 2, f=0)
    with pytest.raises(TypeError, match="positional"):
        entry(1, 2, 3)  # c stays keyword-only


def test_defaults_are_the_templates_objects():
    marker = object()

    @reads_by_name(_record, ("x",))
    def f(*, x=marker):
        pass

    assert f()[0][0] is marker


def test_a_parameter_no_group_reads_is_refused_at_import():
    with pytest.raises(TypeError, match="parameters b are neither read nor unused"):
        @reads_by_name(_record, ("a",))
        def f(a, b):
            pass

    @reads_by_name(_record, ("a",), unused=("b",))
    def g(a, b=None):
        pass

    assert g(1, 2) == ((1,),)


def test_a_name_that_is_no_parameter_is_refused():
    with pytest.raises(TypeError, match="no parameter named z"):
        @reads_by_name(_record, ("a", "z"))
        def f(a):
            pass


def test_variadic_parameters_are_refused():
    with pytest.raises(TypeError, match="only named parameters"):
        @reads_by_name(_record, ("a",), unused=("rest",))
        def f(a, *rest):
            pass


def test_a_traceback_shows_the_compiled_line():
    import traceback

    def boom(*args):
        raise RuntimeError("x")

    @reads_by_name(boom, ("a",))
    def f(a):
        pass

    try:
        f(1)
    except RuntimeError:
        text = traceback.format_exc()
    assert "return _call((a, ))" in text
