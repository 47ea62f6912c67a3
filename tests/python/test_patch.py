"""`relax-straggler patch`: apply / check / revert the shipped integration patches on
fixture trees built from the patches' own pre-image (their context and removed lines),
with git apply and with GNU patch."""

import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from relax_straggler.cli import main
from relax_straggler.cli import patch as patch_cli

PATCHES = Path(patch_cli.PATCHES_DIR)
TARGETS = ["relax", "megatron-lm"]
FILLER = ["# (fixture: upstream lines between hunks are not reproduced)"] * 8


def preimage(patch: Path) -> dict[str, str]:
    """{path: text} holding each hunk's pre-image, hunks separated by filler lines."""
    files: dict[str, list[str]] = {}
    current = None
    for line in patch.read_text().splitlines():
        if line.startswith("--- a/"):
            current = files.setdefault(line[len("--- a/"):].split("\t")[0], [])
        elif line.startswith("@@") and current is not None:
            current.extend(FILLER)
        elif current is not None and line[:1] in (" ", "-") and not line.startswith("--- "):
            current.append(line[1:])
    return {path: "\n".join(lines + FILLER) + "\n" for path, lines in files.items()}


def fixture_tree(root: Path, target: str) -> dict[Path, str]:
    """Writes the pre-image of every patch of `target` under root; returns {file: text}."""
    written: dict[Path, str] = {}
    for p in sorted((PATCHES / target).glob("*.patch")):
        for rel, text in preimage(p).items():
            f = root / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
            written[f] = text
    return written


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
    changed = original[model].replace("config.timers = None", "config.timers = my_timers")
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
