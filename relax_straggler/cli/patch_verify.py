"""What `relax-straggler patch` checks in a patched file beyond "the hunks apply".

A hunk can apply cleanly and still break its host: an added block that uses a name the
file never binds (``sys`` in a module that does not import it) raises NameError on every
start. `verify_file()` compiles the patched file and resolves every name the added lines
read, through the scopes that enclose them (function, lambda, comprehension, class,
module) and the builtins; a name none of them binds is a problem, reported with its file
and line.
"""

from __future__ import annotations

import ast
import builtins
import difflib
from typing import Iterator, Optional, Union

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)
Scope = Union[ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.GeneratorExp,
              ast.ListComp, ast.SetComp, ast.DictComp]
_SCOPES = (ast.Module, ast.ClassDef, *_FUNCTIONS, *_COMPREHENSIONS)
_BUILTINS = frozenset(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__",
                                        "__builtins__", "__path__", "__annotations__"}


def added_lines(before: str, after: str) -> set[int]:
    """1-based numbers of the lines of `after` that are not in `before` (inserted or replaced)."""
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    lines: set[int] = set()
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("insert", "replace"):
            lines.update(range(j1 + 1, j2 + 1))
    return lines


def _own(scope: Scope) -> Iterator[ast.AST]:
    """The nodes of `scope` itself: not those inside the scopes it contains (whose names,
    default values and decorators aside, belong to those scopes)."""
    if isinstance(scope, _COMPREHENSIONS):
        pending: list[ast.AST] = [g for g in scope.generators]
        pending += [scope.key, scope.value] if isinstance(scope, ast.DictComp) else [scope.elt]
    elif isinstance(scope, ast.Lambda):
        pending = [scope.body]
    else:
        pending = list(scope.body)
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pending += node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.ClassDef):
            pending += node.decorator_list + node.bases + [k.value for k in node.keywords]
        elif isinstance(node, ast.Lambda):
            pending += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, _COMPREHENSIONS):
            pending.append(node.generators[0].iter)  # the first iterable is evaluated outside
        else:
            pending.extend(ast.iter_child_nodes(node))


def _bound(scope: Scope) -> Optional[set[str]]:
    """Names `scope` binds; None when it binds names it cannot tell (``from m import *``)."""
    names: set[str] = set()
    if isinstance(scope, _FUNCTIONS):
        a = scope.args
        names.update(x.arg for x in a.posonlyargs + a.args + a.kwonlyargs)
        names.update(x.arg for x in (a.vararg, a.kwarg) if x is not None)
    for node in _own(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names


def _module_bound(tree: ast.Module) -> Optional[set[str]]:
    """Module-level bindings, with the names functions assign after declaring them global."""
    names = _bound(tree)
    if names is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    return names


def _scopes_of(tree: ast.Module) -> dict[int, list[Scope]]:
    """id(Name node) -> its enclosing scopes, innermost first."""
    chains: dict[int, list[Scope]] = {}

    def visit(scope: Scope, chain: list[Scope]) -> None:
        for node in _own(scope):
            if isinstance(node, ast.Name):
                chains[id(node)] = chain
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                                   *_COMPREHENSIONS)):
                visit(node, [node, *chain])

    visit(tree, [tree])
    return chains


def unbound_names(source: str, lines: set[int], filename: str) -> list[str]:
    """Names read on `lines` of `source` that no enclosing scope nor the builtins bind, as
    "FILE:LINE: ..." messages. Raises SyntaxError when `source` does not parse."""
    tree = ast.parse(source, filename)
    chains = _scopes_of(tree)
    cache: dict[int, Optional[set[str]]] = {}
    problems = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.lineno in lines):
            continue
        chain = chains.get(id(node), [tree])
        found = False
        for depth, scope in enumerate(chain):
            if isinstance(scope, ast.ClassDef) and depth > 0:
                continue  # a class body's names are not visible in the functions inside it
            if id(scope) not in cache:
                cache[id(scope)] = _module_bound(scope) if isinstance(scope, ast.Module) else _bound(scope)
            names = cache[id(scope)]
            if names is None or node.id in names:
                found = True
                break
        if not found and node.id not in _BUILTINS:
            problems.append(f"{filename}:{node.lineno}: the patch uses `{node.id}`, which {filename} never "
                            "defines or imports there (NameError when that line runs)")
    return problems


def verify_file(filename: str, before: str, after: str) -> list[str]:
    """Problems of a patched Python file: it does not compile, or a line the patch added reads
    an unbound name. before / after: the file's text without / with the patch."""
    try:
        compile(after, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return [f"{filename}:{exc.lineno}: does not compile once patched: {exc.msg}"]
    return unbound_names(after, added_lines(before, after), filename)
