"""relax_straggler.integrations.megatron_compat: the Megatron-LM internals the integration
relies on, checked on live modules (fake ones here) and on source trees (the synthetic host,
and real Megatron-LM checkouts when RELAX_STRAGGLER_MEGATRON_LM_TREES lists them, as
tests/compat/megatron_lm_sources.sh does for each supported release)."""

import logging
import os
import re
import shutil
import sys
import types
from pathlib import Path

import pytest

from relax_straggler.cli import main
from relax_straggler.integrations import megatron_compat as compat

HOST = Path(__file__).resolve().parent / "fixtures" / "patch_hosts" / "megatron-lm"


def fake_megatron(monkeypatch, training_src: str, global_vars_src: str, major: int = 0, minor: int = 16) -> None:
    """Installs megatron.training.{training,global_vars} and megatron.core.package_info built from source."""
    mods = {}
    for name, src in (("megatron.training.training", training_src), ("megatron.training.global_vars", global_vars_src)):
        mod = types.ModuleType(name)
        mod.__file__ = f"<{name}>"
        exec(compile(src, mod.__file__, "exec"), mod.__dict__)
        mods[name] = mod
    training_pkg = types.ModuleType("megatron.training")
    training_pkg.training, training_pkg.global_vars = mods["megatron.training.training"], mods["megatron.training.global_vars"]
    info = types.SimpleNamespace(MAJOR=major, MINOR=minor, __version__=f"{major}.{minor}.0")
    core = types.ModuleType("megatron.core")
    core.package_info = info
    for name, mod in {**mods, "megatron.training": training_pkg, "megatron.core": core,
                      "megatron.core.package_info": info}.items():
        monkeypatch.setitem(sys.modules, name, mod)


GOOD_TRAINING = "def train_step(iteration=None):\n    pass\n\ndef train():\n    train_step(iteration=0)\n"
GOOD_GLOBALS = "_GLOBAL_TIMERS = None\n\ndef get_timers():\n    return _GLOBAL_TIMERS\n"


def test_the_live_slots_of_a_supported_megatron_lm(monkeypatch):
    fake_megatron(monkeypatch, GOOD_TRAINING, GOOD_GLOBALS)
    assert compat.release() == (0, 16)
    step = compat.train_step_slot()
    assert step.get() is sys.modules["megatron.training.training"].train_step
    timers = compat.global_timers_slot()
    timers.set("adapter")
    assert sys.modules["megatron.training.global_vars"].get_timers() == "adapter"


@pytest.mark.parametrize("training, globals_, slot, message", [
    ("def train_step():\n    pass\n\ndef train(train_step):\n    train_step()\n", GOOD_GLOBALS, "train_step_slot",
     "train() does not call the module's train_step() by name"),
    (GOOD_TRAINING, "_TIMERS = None\n\ndef get_timers():\n    return _TIMERS\n", "global_timers_slot",
     "get_timers() does not return the module's _GLOBAL_TIMERS"),
])
def test_a_changed_internal_is_a_clear_error(monkeypatch, training, globals_, slot, message):
    fake_megatron(monkeypatch, training, globals_)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        getattr(compat, slot)()


def test_release_bounds(monkeypatch, caplog):
    fake_megatron(monkeypatch, GOOD_TRAINING, GOOD_GLOBALS, minor=15)
    with pytest.raises(RuntimeError, match=r"Megatron-Core 0.15.0 is older than the oldest supported release 0.16"):
        compat.release()
    fake_megatron(monkeypatch, GOOD_TRAINING, GOOD_GLOBALS, minor=21)
    with caplog.at_level(logging.WARNING):
        assert compat.release() == (0, 21)
    assert "newer than the last verified release 0.20" in caplog.text


def test_the_synthetic_host_tree_passes_and_its_variants_do_not(tmp_path):
    assert compat.check_tree(HOST) == []
    tree = tmp_path / "tree"
    shutil.copytree(HOST, tree)
    training = tree / compat.TRAINING
    training.write_text(training.read_text().replace("iteration=iteration)", "iteration)"))
    (tree / compat.GLOBAL_VARS).write_text("def get_timers():\n    return None\n")
    (tree / compat.PACKAGE_INFO).unlink()
    assert compat.check_tree(tree) == [
        "megatron/core/package_info.py: missing",
        f"{compat.TRAINING}:{next(i for i, l in enumerate(training.read_text().splitlines(), 1) if l.startswith('def train('))}: "
        "train() calls train_step() without iteration=",
        "megatron/training/global_vars.py: get_timers() does not return _GLOBAL_TIMERS"]


def test_hook_placement_in_a_patched_train():
    ok = ("import sys\n\ndef train(args):\n    train_started()\n    while True:\n        break\n    train_ended()\n"
          "    if args.x:\n        sys.exit(1)\n")
    assert compat.check_patched_train(ok) == []
    late = ok.replace("    train_ended()\n    if args.x:\n        sys.exit(1)\n",
                      "    if args.x:\n        sys.exit(1)\n    train_ended()\n")
    assert compat.check_patched_train(late) == [
        f"{compat.TRAINING}:8: train() calls sys.exit() before train_ended(): the last reports would not be flushed"]


UPSTREAM = [Path(p) for p in os.environ.get("RELAX_STRAGGLER_MEGATRON_LM_TREES", "").split(os.pathsep) if p]


@pytest.mark.skipif(not UPSTREAM, reason="no Megatron-LM checkouts given (RELAX_STRAGGLER_MEGATRON_LM_TREES; "
                                         "tests/compat/megatron_lm_sources.sh sets it)")
@pytest.mark.parametrize("tree", UPSTREAM, ids=str)
def test_an_upstream_megatron_lm_tree(tree, tmp_path, caplog):
    """A supported release passes, is patched and has its hooks in place; an older one is
    refused naming its release and the oldest supported one, and left as it was."""
    copy = tmp_path / "tree"
    shutil.copytree(tree / "megatron", copy / "megatron")
    release, unserved = compat.tree_release(tree)
    if unserved:
        assert main(["patch", "megatron-lm", str(copy)]) == 1
        assert f"{release} (megatron/core/package_info.py) is older than the oldest supported release 0.16" \
            in caplog.text
        assert (copy / compat.TRAINING).read_text() == (tree / compat.TRAINING).read_text()
        return
    assert compat.check_tree(tree) == []
    assert main(["patch", "megatron-lm", str(copy), "--check"]) == 0
    assert main(["patch", "megatron-lm", str(copy)]) == 0
    assert compat.check_patched_train((copy / compat.TRAINING).read_text()) == []


PATCHED_TRAINING = """import sys

def train_step(iteration=None):
    pass

def training_log(iteration):
    print('iteration', iteration)

def train(args):
    iteration = 0
    train_started()
    while iteration < 3:
        train_step(iteration=iteration)
        iteration += 1
        training_log(iteration)
    train_ended()
    if args.exit:
        sys.exit(0)

def evaluate_and_print_results():
    pass
"""


def running_megatron(monkeypatch, tmp_path, training_src: str) -> None:
    """fake_megatron() whose training module has a source file, as an installed one does."""
    fake_megatron(monkeypatch, training_src, GOOD_GLOBALS)
    path = tmp_path / "training.py"
    path.write_text(training_src)
    sys.modules["megatron.training.training"].__file__ = str(path)


def test_the_running_train_is_checked_as_patched(monkeypatch, tmp_path):
    running_megatron(monkeypatch, tmp_path, PATCHED_TRAINING)
    compat.check_running_train()


@pytest.mark.parametrize("edit, message", [
    # the end hook where GNU patch with fuzz put it on core 0.15: another function
    (lambda t: t.replace("    train_ended()\n", "").replace("def evaluate_and_print_results():\n",
                                                            "def evaluate_and_print_results():\n    train_ended()\n"),
     "train() does not call train_ended() after its training loop"),
    # the step counted before train_step(): Megatron-LM would log it under the number it passed
    (lambda t: t.replace("        train_step(iteration=iteration)\n        iteration += 1\n",
                         "        iteration += 1\n        train_step(iteration=iteration)\n"),
     "train() does not count the step (iteration += 1) between train_step() and training_log()"),
], ids=["end-hook-elsewhere", "step-counted-first"])
def test_a_running_train_the_integration_cannot_serve_is_refused_before_installing(monkeypatch, tmp_path, edit, message):
    from relax_straggler.integrations import megatron_lm

    running_megatron(monkeypatch, tmp_path, edit(PATCHED_TRAINING))
    monkeypatch.setattr(megatron_lm, "install", lambda *a, **k: pytest.fail("installed on a refused train()"))
    with pytest.raises(RuntimeError, match=re.escape(message)) as error:
        megatron_lm.train_started(types.SimpleNamespace(), [], None, None)
    assert str(tmp_path / "training.py") in str(error.value)
