"""The private parts of Megatron-LM that the Megatron-LM integration relies on, in one place.

Four assumptions, each checked on the running modules (`release()`, `train_step_slot()`,
`global_timers_slot()`, `check_running_train()`: RuntimeError naming what is missing) and on
a source tree (`tree_release()` and `check_tree()`, which ``relax-straggler patch
megatron-lm PATH`` runs before it changes anything):

- the release: ``megatron/core/package_info.py`` MAJOR.MINOR at least `MIN_RELEASE`. Checked
  on core_v0.16.1, 0.17.1, 0.18.2, 0.19.0 and main 0.20.0 (docs/INTEGRATIONS.md); a newer
  release runs if the assumptions below hold, with one warning. Core 0.15 and older are
  refused: their ``train_step()`` takes no ``iteration`` and the end hook's context lines
  are not there.
- ``train()`` in ``megatron/training/training.py`` calls ``train_step`` by its module-global
  name: the integration rebinds that global for the run, so every training step runs in the
  analysis' step scope without a patch inside the loop (whose indentation and surrounding
  context differ between releases).
- ``train()`` passes ``iteration=`` to ``train_step()``, then counts the step (``iteration
  += 1``) and logs it with ``training_log(..., iteration, ...)``: Megatron-LM's log, its
  TensorBoard / W&B steps and its checkpoints name a step by the number of steps done
  after it, one more than the ``iteration`` its ``train_step()`` received. The integration
  labels its reports the same way.
- ``get_timers()`` in ``megatron/training/global_vars.py`` returns the module global
  ``_GLOBAL_TIMERS``: inside a step it holds the adapter, so the timers the training
  scripts start on ``get_timers()`` (``pretrain_gpt.forward_step``'s ``batch-generator``, the
  ``optimizer`` timer of ``train_step``) reach the analysis, not only those on
  ``config.timers``.

`check_patched_train()` checks where the patch put its two calls in ``train()``: the start
before the training loop, the end after it and before every ``sys.exit()``;
`check_running_train()` checks the same on the running ``training.py``, however the patch
was applied (by hand with fuzz, a hook can land in another function).
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)

MIN_RELEASE = (0, 16)
LAST_VERIFIED = (0, 20)  # main at d98e8a64ddf3 (package_info 0.20.0)
START_HOOK = "train_started"  # relax_straggler.integrations.megatron_lm, as the patch calls them
END_HOOK = "train_ended"

TRAINING = "megatron/training/training.py"
GLOBAL_VARS = "megatron/training/global_vars.py"
PACKAGE_INFO = "megatron/core/package_info.py"


@dataclass(frozen=True)
class Slot:
    """A module global the integration swaps: `owner.name`."""

    owner: ModuleType
    name: str

    def get(self) -> Any:
        return getattr(self.owner, self.name)

    def set(self, value: Any) -> None:
        setattr(self.owner, self.name, value)


def _uses_global(code: CodeType, name: str) -> bool:
    """Whether the function of `code` reads `name` as a global (not as a local or closure)."""
    return name in code.co_names and name not in code.co_varnames and name not in code.co_cellvars \
        and name not in code.co_freevars


def release() -> tuple[int, int]:
    """Megatron-Core's (major, minor) from megatron.core.package_info. Raises RuntimeError below
    MIN_RELEASE; logs one warning above LAST_VERIFIED."""
    from megatron.core import package_info

    found = (int(package_info.MAJOR), int(package_info.MINOR))
    _judge_release(found, f"Megatron-Core {package_info.__version__}")
    return found


def _judge_release(found: tuple[int, int], what: str) -> None:
    if found < MIN_RELEASE:
        raise RuntimeError(f"relax_straggler: {what} is older than the oldest supported release "
                           f"{MIN_RELEASE[0]}.{MIN_RELEASE[1]} (docs/INTEGRATIONS.md)")
    if found > LAST_VERIFIED:
        log.warning("relax_straggler: %s is newer than the last verified release %d.%d; its training loop "
                    "passed the integration's checks", what, *LAST_VERIFIED)


def train_step_slot() -> Slot:
    """``megatron.training.training.train_step``, which ``train()`` calls by that global name.
    Raises RuntimeError when this Megatron-LM's train() does not."""
    from megatron.training import training

    train = getattr(training, "train", None)
    if not callable(getattr(training, "train_step", None)) or not callable(train) \
            or not _uses_global(train.__code__, "train_step"):
        raise RuntimeError(f"relax_straggler: {training.__file__}: train() does not call the module's "
                           "train_step() by name; this Megatron-LM is not supported (docs/INTEGRATIONS.md)")
    return Slot(training, "train_step")


def global_timers_slot() -> Slot:
    """``megatron.training.global_vars._GLOBAL_TIMERS``, which ``get_timers()`` returns. Raises
    RuntimeError when this Megatron-LM keeps its timers elsewhere."""
    from megatron.training import global_vars

    get_timers: Optional[Callable] = getattr(global_vars, "get_timers", None)
    if not hasattr(global_vars, "_GLOBAL_TIMERS") or get_timers is None \
            or not _uses_global(get_timers.__code__, "_GLOBAL_TIMERS"):
        raise RuntimeError(f"relax_straggler: {global_vars.__file__}: get_timers() does not return the module's "
                           "_GLOBAL_TIMERS; this Megatron-LM is not supported (docs/INTEGRATIONS.md)")
    return Slot(global_vars, "_GLOBAL_TIMERS")


def check_running_train() -> None:
    """Checks the source of the running ``megatron/training/training.py`` as a patched tree
    is checked (`check_patched_train()`, `check_train_loop()`), whichever way the patch was
    applied. Raises RuntimeError naming the file, the lines and what is wrong; logs one
    warning when the source cannot be read (nothing then to check)."""
    from megatron.training import training

    path = Path(training.__file__ or "")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("relax_straggler: cannot read %s (%s): the hook placement is not checked", path, exc)
        return
    problems = check_patched_train(source, str(path)) or check_train_loop(ast.parse(source, str(path)), str(path))
    if problems:
        raise RuntimeError("relax_straggler: this Megatron-LM's train() cannot be served (docs/INTEGRATIONS.md): "
                           + "; ".join(problems))


# Source checks (no import of the tree) -------------------------------------------------------

def _function(tree: ast.Module, name: str) -> Optional[ast.FunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _own_nodes(fn: ast.FunctionDef):
    """The nodes of `fn`'s own body, not those of functions or classes defined inside it."""
    pending = list(fn.body)
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                pending.append(child)


def _binds(fn: ast.FunctionDef, name: str) -> bool:
    """Whether `fn` makes `name` local (assignment, import, parameter)."""
    params = [a.arg for a in fn.args.args + fn.args.posonlyargs + fn.args.kwonlyargs]
    if name in params:
        return True
    for node in _own_nodes(fn):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name
                                                                  for a in node.names):
            return True
    return False


def _calls(fn: ast.FunctionDef, name: str) -> list[ast.Call]:
    """Calls `name(...)` in `fn`'s own body."""
    return [n for n in _own_nodes(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name]


def _read(root: Path, rel: str, problems: list[str]) -> Optional[ast.Module]:
    path = root / rel
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        problems.append(f"{rel}: missing")
    except SyntaxError as exc:
        problems.append(f"{rel}:{exc.lineno}: does not parse: {exc.msg}")
    return None


def tree_release(root: Path) -> tuple[str, list[str]]:
    """The Megatron-Core release of the checkout at `root` as text (e.g. "Megatron-Core
    0.15.3", from megatron/core/package_info.py; "no Megatron-Core release" when it cannot be
    read) and why the integration cannot serve it, naming the oldest supported release
    (empty when it can)."""
    problems: list[str] = []
    info = _read(root, PACKAGE_INFO, problems)
    if info is None:
        return "no Megatron-Core release", problems
    values = _int_constants(info)
    if "MAJOR" not in values or "MINOR" not in values:
        return "no Megatron-Core release", [f"{PACKAGE_INFO}: no MAJOR / MINOR constants"]
    found = (values["MAJOR"], values["MINOR"])
    what = f"Megatron-Core {'.'.join(str(v) for v in (*found, values.get('PATCH', 0)))}"
    try:
        _judge_release(found, f"{what} ({PACKAGE_INFO})")
    except RuntimeError as exc:
        problems.append(str(exc))
    return what, problems


def _int_constants(tree: ast.Module) -> dict[str, int]:
    values: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            values[node.targets[0].id] = node.value.value
    return values


def check_train_loop(training: ast.Module, filename: str = TRAINING) -> list[str]:
    """What in a training.py's ``train()`` breaks the assumptions on its loop (the module
    docstring: train_step() called by name with iteration=, the step counted between it and
    training_log()), one message per problem naming the line; empty when none does."""
    train = _function(training, "train")
    if train is None or _function(training, "train_step") is None:
        return [f"{filename}: no module-level train() and train_step()"]
    steps = _calls(train, "train_step")
    if not steps or _binds(train, "train_step"):
        return [f"{filename}:{train.lineno}: train() does not call the module's train_step() by name"]
    if not all(any(k.arg == "iteration" for k in c.keywords) for c in steps):
        return [f"{filename}:{train.lineno}: train() calls train_step() without iteration="]
    step = max(c.lineno for c in steps)
    counts = [n.lineno for n in _own_nodes(train) if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
              and isinstance(n.target, ast.Name) and n.target.id == "iteration" and n.lineno > step]
    logs = [c.lineno for c in _calls(train, "training_log")
            if any(isinstance(a, ast.Name) and a.id == "iteration" for a in c.args)]
    if not counts or not any(min(counts) < line for line in logs):
        return [f"{filename}:{step}: train() does not count the step (iteration += 1) between train_step() and "
                "training_log(): the reports' step numbers would not be the ones Megatron-LM logs"]
    return []


def check_tree(root: Path) -> list[str]:
    """What in the Megatron-LM checkout at `root` breaks the integration's assumptions (the
    module docstring), one message per problem naming file and line; empty when none does."""
    problems = tree_release(root)[1]
    training = _read(root, TRAINING, problems)
    if training is not None:
        problems += check_train_loop(training)
    global_vars = _read(root, GLOBAL_VARS, problems)
    if global_vars is not None:
        get_timers = _function(global_vars, "get_timers")
        if get_timers is None or not any(isinstance(n, ast.Name) and n.id == "_GLOBAL_TIMERS"
                                         for n in _own_nodes(get_timers)):
            problems.append(f"{GLOBAL_VARS}: get_timers() does not return _GLOBAL_TIMERS")
    return problems


def _is_sys_exit(call: ast.Call) -> bool:
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == "exit" and isinstance(f.value, ast.Name) and f.value.id == "sys"


def check_patched_train(source: str, filename: str = TRAINING) -> list[str]:
    """Where the patch's hooks sit in a patched training.py: START_HOOK called in train()
    before its training loop, END_HOOK after the loop and before every ``sys.exit()`` of
    train(). One message per problem, naming the line; empty when both are placed right."""
    try:
        train = _function(ast.parse(source, filename), "train")
    except SyntaxError as exc:
        return [f"{filename}:{exc.lineno}: does not parse: {exc.msg}"]
    if train is None:
        return [f"{filename}: no module-level train()"]
    loops = sorted((n for n in _own_nodes(train) if isinstance(n, ast.While)), key=lambda n: n.lineno)
    if not loops:
        return [f"{filename}:{train.lineno}: train() has no training loop"]
    loop = loops[0]
    starts = sorted(c.lineno for c in _calls(train, START_HOOK))
    ends = sorted(c.lineno for c in _calls(train, END_HOOK))
    problems = []
    if not starts or starts[0] > loop.lineno:
        problems.append(f"{filename}:{loop.lineno}: train() does not call {START_HOOK}() before its training loop")
    after_loop = [line for line in ends if line > (loop.end_lineno or loop.lineno)]
    if not after_loop:
        problems.append(f"{filename}:{loop.lineno}: train() does not call {END_HOOK}() after its training loop")
    for call in (c for c in _own_nodes(train) if isinstance(c, ast.Call) and _is_sys_exit(c)):
        if not any(line < call.lineno for line in after_loop):
            problems.append(f"{filename}:{call.lineno}: train() calls sys.exit() before {END_HOOK}(): "
                            "the last reports would not be flushed")
    return problems
