"""`relax-straggler patch`: apply / check / revert the shipped integration patches on the
synthetic host trees of tests/python/fixtures/patch_hosts (small programs in the shape of
the files the patches edit), with git apply and with GNU patch, and the refusal of trees
the patches apply to but would break."""

import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from relax_straggler.cli import main
from relax_straggler.cli import patch as patch_cli

PATCHES = Path(patch_cli.PATCHES_DIR)
HOSTS = Path(__file__).resolve().parent / "fixtures" / "patch_hosts"
TARGETS = ["relax", "megatron-lm"]


def fixture_tree(root: Path, target: str) -> dict[Path, str]:
    """Copies the synthetic host tree of `target` to root; returns {file: text} of the files
    the target's patches touch."""
    shutil.copytree(HOSTS / target, root, dirs_exist_ok=True)
    return {root / rel: (root / rel).read_text()
            for p in sorted((PATCHES / target).glob("*.patch")) for rel in patch_cli.touched_files(p)}


def run(*argv: str) -> int:
    return main(["patch", *argv])


@pytest.mark.parametrize("target", TARGETS)
def test_each_patch_names_its_upstream_commit(target):
    files = sorted((PATCHES / target).glob("*.patch"))
    assert files
    for f in files:
        assert re.fullmatch(r".+ @ [0-9a-f]{40}", patch_cli.upstream_of(f)), f


@pytest.mark.parametrize("target", TARGETS)
def test_check_apply_check_revert_round_trip(tmp_path, target, caplog):
    caplog.set_level(logging.INFO)
    original = fixture_tree(tmp_path, target)
    assert run(target, str(tmp_path), "--check") == 0
    assert "applies" in caplog.text and "conflicts" not in caplog.text
    assert all(f.read_text() == t for f, t in original.items())  # --check writes nothing

    assert run(target, str(tmp_path)) == 0
    assert any("straggler" in f.read_text() and f.read_text() != t for f, t in original.items())
    caplog.clear()
    assert run(target, str(tmp_path), "--check") == 0
    assert "already applied" in caplog.text
    assert run(target, str(tmp_path)) == 0  # nothing to do
    assert "every patch is already applied" in caplog.text

    assert run(target, str(tmp_path), "--revert") == 0
    assert all(f.read_text() == t for f, t in original.items())
    caplog.clear()
    assert run(target, str(tmp_path), "--revert") == 0
    assert "no patch is applied" in caplog.text


def test_a_conflict_changes_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    original = fixture_tree(tmp_path, "relax")
    model = tmp_path / "relax/backends/megatron/model.py"
    changed = original[model].replace("        # Run training step.\n", "        # Run the training step.\n")
    model.write_text(changed)
    assert run("relax", str(tmp_path), "--check") == 1
    assert "conflicts" in caplog.text
    assert run("relax", str(tmp_path)) == 1
    assert model.read_text() == changed
    arguments = tmp_path / "relax/utils/arguments.py"
    assert arguments.read_text() == original[arguments]  # the patch that would apply was not applied either


def test_partly_applied_is_refused_and_revertible(tmp_path, caplog):
    original = fixture_tree(tmp_path, "relax")
    first = min((PATCHES / "relax").glob("*.patch"))
    subprocess.run(["git", "apply", str(first)], cwd=tmp_path, check=True)
    assert run("relax", str(tmp_path), "--check") == 1  # what applying would answer
    assert "only some patches are applied" in caplog.text
    caplog.clear()
    assert run("relax", str(tmp_path)) == 1
    assert "only some patches are applied" in caplog.text
    assert run("relax", str(tmp_path), "--revert") == 0
    assert all(f.read_text() == t for f, t in original.items())


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")
def test_gnu_patch_backend(tmp_path, monkeypatch):
    original = fixture_tree(tmp_path, "megatron-lm")
    monkeypatch.setattr(patch_cli, "choose_tool", lambda root: patch_cli.GnuPatch(root))
    assert run("megatron-lm", str(tmp_path), "--check") == 0
    assert run("megatron-lm", str(tmp_path)) == 0
    assert run("megatron-lm", str(tmp_path)) == 0  # already applied
    assert run("megatron-lm", str(tmp_path), "--revert") == 0
    assert all(f.read_text() == t for f, t in original.items())
    assert not list(tmp_path.rglob("*.orig")) and not list(tmp_path.rglob("*.rej"))


def test_bad_arguments(tmp_path, caplog):
    assert run("deepspeed", str(tmp_path), "--check") == 2
    assert "no patches for 'deepspeed'" in caplog.text and "megatron-lm" in caplog.text
    assert run("relax", str(tmp_path / "missing"), "--check") == 2
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "sub").mkdir()
    assert run("relax", str(tmp_path / "sub"), "--check") == 2
    assert "give the checkout's root" in caplog.text


def _old_relax_arguments_patch(folder: Path) -> None:
    """A patches/ folder holding an arguments patch of the shape that broke Relax: an added
    function reading sys.argv in a module that does not import sys."""
    shipped = (PATCHES / "relax" / "0001-arguments-straggler-analysis-flags.patch").read_text()
    (folder / "relax").mkdir(parents=True)
    old = shipped.replace("+            import sys\n+\n", "").replace("@@ -43,2 +43,18 @@", "@@ -43,2 +43,16 @@")
    assert old.count("import sys") == 0 and "+43,16" in old
    (folder / "relax" / "0001.patch").write_text(old)


def test_a_patch_that_would_raise_name_error_is_refused(tmp_path, caplog):
    tree, patches = tmp_path / "tree", tmp_path / "patches"
    original = fixture_tree(tree, "relax")
    _old_relax_arguments_patch(patches)
    for mode in (["--check"], []):
        caplog.clear()
        assert run("relax", str(tree), *mode, "--patches-dir", str(patches)) == 1
        assert "relax/utils/arguments.py:" in caplog.text and "uses `sys`" in caplog.text
        assert "would not work there" in caplog.text
    assert all(f.read_text() == t for f, t in original.items())


def test_an_applied_patch_that_breaks_its_host_is_reported(tmp_path, caplog):
    tree, patches = tmp_path / "tree", tmp_path / "patches"
    fixture_tree(tree, "relax")
    _old_relax_arguments_patch(patches)
    subprocess.run(["git", "apply", str(patches / "relax" / "0001.patch")], cwd=tree, check=True)
    assert run("relax", str(tree), "--check", "--patches-dir", str(patches)) == 1
    assert "uses `sys`" in caplog.text and "--revert takes them out" in caplog.text
    assert run("relax", str(tree), "--revert", "--patches-dir", str(patches)) == 0


@pytest.mark.parametrize("edit, reason", [
    # train() exits right after its loop, before the place of the patch's end hook
    (lambda t: t.replace("\n    # Destroy CUDA Graphs.\n",
                         "\n    if should_exit:\n        sys.exit(exit_code)\n\n    # Destroy CUDA Graphs.\n"),
     "calls sys.exit() before train_ended()"),
    # train() runs its steps through something else than the module's train_step()
    (lambda t: t.replace("should_exit, exit_code = train_step(", "should_exit, exit_code = _my_step("),
     "does not call the module's train_step() by name"),
])
def test_a_megatron_lm_tree_the_integration_cannot_hook_is_refused(tmp_path, caplog, edit, reason):
    original = fixture_tree(tmp_path, "megatron-lm")
    training = tmp_path / "megatron/training/training.py"
    training.write_text(edit(training.read_text()))
    changed = training.read_text()
    assert changed != original[training]
    assert run("megatron-lm", str(tmp_path), "--check") == 1
    assert reason in caplog.text
    assert run("megatron-lm", str(tmp_path)) == 1
    assert training.read_text() == changed


def test_a_megatron_lm_release_too_old_is_refused(tmp_path, caplog):
    fixture_tree(tmp_path, "megatron-lm")
    info = tmp_path / "megatron/core/package_info.py"
    info.write_text(info.read_text().replace("MINOR = 16", "MINOR = 15"))
    assert run("megatron-lm", str(tmp_path), "--check") == 1
    assert "older than the oldest supported release 0.16" in caplog.text


def _megatron_lm_0_15(root: Path) -> None:
    """The synthetic host in the shape of Megatron-LM core 0.15 where the patch cannot go:
    release 0.15.3, and no `# Destroy CUDA Graphs.` block after the training loop (the end
    hook's context)."""
    info = root / "megatron/core/package_info.py"
    info.write_text(info.read_text().replace("MINOR = 16", "MINOR = 15").replace("PATCH = 1", "PATCH = 3"))
    training = root / "megatron/training/training.py"
    text = training.read_text()
    cut = text.replace("    # Destroy CUDA Graphs.\n    if args.fixture_cuda_graphs:\n"
                       "        raise AssertionError(\"not exercised\")\n\n", "")
    assert cut != text
    training.write_text(cut)


@pytest.mark.parametrize("tool", [patch_cli.GitApply, patch_cli.GnuPatch])
def test_a_megatron_lm_release_the_patch_cannot_serve_is_refused_by_name(tmp_path, monkeypatch, caplog, tool):
    if tool is patch_cli.GnuPatch and shutil.which("patch") is None:
        pytest.skip("GNU patch not installed")
    monkeypatch.setattr(patch_cli, "choose_tool", tool)
    original = fixture_tree(tmp_path, "megatron-lm")
    _megatron_lm_0_15(tmp_path)
    changed = {f: f.read_text() for f in original}
    for mode in (["--check"], []):
        caplog.clear()
        assert run("megatron-lm", str(tmp_path), *mode) == 1
        assert "Megatron-Core 0.15.3" in caplog.text and "oldest supported release 0.16" in caplog.text
        assert "patch failed" not in caplog.text and "FAILED" not in caplog.text  # not the tool's raw refusal
    assert all(f.read_text() == t for f, t in changed.items())


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch not installed")
def test_gnu_patch_never_applies_with_fuzz(tmp_path, monkeypatch, caplog):
    """A hunk whose context lines differ (here the end hook's) conflicts: GNU patch would
    otherwise drop context lines (fuzz) and put the hook wherever the rest matches."""
    fixture_tree(tmp_path, "megatron-lm")
    training = tmp_path / "megatron/training/training.py"
    training.write_text(training.read_text().replace("    # Destroy CUDA Graphs.\n", "    # Tear CUDA graphs down.\n"))
    changed = training.read_text()
    patch = PATCHES / "megatron-lm" / "0001-training-straggler-analysis.patch"
    assert subprocess.run(["patch", "-p1", "--dry-run", "--batch", "-i", str(patch)], cwd=tmp_path,
                          capture_output=True, text=True).stdout.count("with fuzz") == 1  # what fuzz would do
    ok, message = patch_cli.GnuPatch(tmp_path).check(patch)
    assert not ok and "FAILED" in message
    monkeypatch.setattr(patch_cli, "choose_tool", patch_cli.GnuPatch)
    caplog.set_level(logging.INFO)
    assert run("megatron-lm", str(tmp_path)) == 1
    assert "conflicts" in caplog.text and "Hunk #2 FAILED" in caplog.text and "Megatron-Core 0.16.1" in caplog.text
    assert training.read_text() == changed
