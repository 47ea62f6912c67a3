"""relax_straggler.cli.patch_verify: a patched file must compile and every name its added
lines read must be bound in a scope that encloses them."""

import textwrap

import pytest

from relax_straggler.cli.patch_verify import added_lines, unbound_names, verify_file

BEFORE = textwrap.dedent('''\
    import argparse


    def chain(parser):
        def add_group(parser):
            return parser

        parser = add_group(parser)
        return parser
    ''')


def patched(block: str) -> str:
    """BEFORE with `block` added inside chain(), after its last add_*."""
    after = BEFORE.replace("    parser = add_group(parser)\n",
                           "    parser = add_group(parser)\n" + textwrap.indent(textwrap.dedent(block), " " * 4))
    assert after != BEFORE
    return after


def test_added_lines_are_the_inserted_and_replaced_ones():
    assert added_lines("a\nb\nc\n", "a2\nb\nnew\nc\n") == {1, 3}
    assert added_lines("a\nb\n", "a\n") == set()


@pytest.mark.parametrize("block", [
    # the added function imports what it uses: sys is local to it
    '''
    def add_straggler(parser):
        import sys

        if any(a == "--x" for a in sys.argv[1:]):
            raise ImportError("needs it")
        return parser
    ''',
    # names of the module (argparse), of the enclosing function (parser, add_group), builtins (any, len)
    '''
    parser = add_group(parser) if isinstance(parser, argparse.ArgumentParser) and len([p for p in [parser]]) else parser
    ''',
    # a comprehension's own target, a lambda's parameter, an exception's name
    '''
    try:
        names = sorted({n for n in dir(parser)}, key=lambda k: k.lower())
    except ImportError as exc:
        raise RuntimeError(str(exc)) from exc
    ''',
])
def test_bound_names_pass(block):
    assert verify_file("host.py", BEFORE, patched(block)) == []


def test_a_name_no_scope_binds_is_reported_with_its_line():
    after = patched('''
    def add_straggler(parser):
        if "--x" in sys.argv[1:]:
            raise
        return parser
    ''')
    problems = verify_file("relax/utils/arguments.py", BEFORE, after)
    line = next(i for i, text in enumerate(after.splitlines(), 1) if "sys.argv" in text)
    assert problems == [f"relax/utils/arguments.py:{line}: the patch uses `sys`, which relax/utils/arguments.py "
                        "never defines or imports there (NameError when that line runs)"]


def test_only_added_lines_are_judged_and_class_bodies_do_not_leak():
    source = textwrap.dedent('''\
        class A:
            x = 1

            def f(self):
                return x
        y = undefined_before
        ''')
    assert unbound_names(source, {5}, "a.py") == ["a.py:5: the patch uses `x`, which a.py never defines or imports "
                                                  "there (NameError when that line runs)"]
    assert unbound_names(source, {2}, "a.py") == []  # line 6 is not the patch's


def test_star_imports_and_module_globals_assigned_in_functions_count_as_bound():
    assert unbound_names("from os.path import *\nprint(join('a', 'b'))\n", {2}, "m.py") == []
    assert unbound_names("def f():\n    global G\n    G = 1\n\ndef g():\n    return G\n", {6}, "m.py") == []


def test_a_patch_that_does_not_compile_is_reported():
    assert verify_file("t.py", BEFORE, BEFORE + "def broken(:\n") == ["t.py:10: does not compile once patched: "
                                                                       "invalid syntax"]
