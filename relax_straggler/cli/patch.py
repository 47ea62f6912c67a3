"""Apply, check or revert the integration patches: relax-straggler patch TARGET PATH.

TARGET is a folder of patches/ (``relax``, ``megatron-lm``); PATH the root of that
framework's checkout. The patches are applied in name order, all or none: every one is
checked first, and nothing is written unless all of them apply. ``--check`` only says,
per patch, whether it applies, is already applied, or conflicts; ``--revert`` takes
applied patches out again in reverse order.

A release the patches cannot serve is refused first, naming the release found and the
oldest supported one (megatron-lm: megatron/core/package_info.py), instead of the patch
tool's conflict. Applying is not enough: before writing anything (and with ``--check``) the patches are
applied to a temporary copy of the files they touch, and the result is verified
(relax_straggler.cli.patch_verify: every patched file compiles, every name an added line
reads is bound there) together with the target's own checks (megatron-lm: the Megatron-LM
internals the integration relies on, relax_straggler.integrations.megatron_compat, and
the end hook placed before every exit of train()). A tree that fails is refused with
the reasons, and nothing is changed.

Patching uses ``git apply`` (the checkout need not be a git repository) or, where git
is missing, GNU ``patch -p1 --fuzz=0``: every context line of a hunk must match, so a hunk
never lands beside lines it was not made for. Each patch file starts with free text
naming the upstream commit it was made against; both tools skip it.

Exit codes: 0 done (or nothing to do), 1 a patch conflicts, the patched tree fails its
checks or a tool failed, 2 bad arguments (unknown target, PATH not a directory).
"""

from __future__ import annotations

import argparse
import enum
import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from relax_straggler.cli.common import add_output_arguments, emit
from relax_straggler.cli.patch_verify import verify_file

log = logging.getLogger(__name__)

PATCHES_DIR = Path(__file__).resolve().parents[2] / "patches"


class State(enum.Enum):
    APPLIES = "applies"
    APPLIED = "already applied"
    CONFLICTS = "conflicts"


@dataclass(frozen=True)
class PatchStatus:
    path: Path
    upstream: str  # the "Upstream:" line of the patch header, or ""
    state: State
    detail: str  # the tool's message when it conflicts


class Tool:
    """Runs one patch tool against a checkout. check()/apply() return (ok, message)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _cmd(self, patch: Path, reverse: bool, dry_run: bool) -> list[str]:
        raise NotImplementedError

    def _run(self, cmd: list[str]) -> tuple[bool, str]:
        proc = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True)
        return proc.returncode == 0, (proc.stdout + proc.stderr).strip()

    def check(self, patch: Path, reverse: bool = False) -> tuple[bool, str]:
        return self._run(self._cmd(patch, reverse, dry_run=True))

    def apply(self, patch: Path, reverse: bool = False) -> tuple[bool, str]:
        return self._run(self._cmd(patch, reverse, dry_run=False))


class GitApply(Tool):
    """git apply: a hunk applies only where all its context lines match (it may move)."""

    name = "git apply"

    def _cmd(self, patch: Path, reverse: bool, dry_run: bool) -> list[str]:
        cmd = ["git", "apply", "--whitespace=nowarn"]
        if reverse:
            cmd.append("--reverse")
        if dry_run:
            cmd.append("--check")
        return [*cmd, str(patch)]


class GnuPatch(Tool):
    """GNU patch without fuzz: by default it drops up to two context lines of a hunk that
    does not match and applies the rest wherever it fits."""

    name = "patch"

    def _cmd(self, patch: Path, reverse: bool, dry_run: bool) -> list[str]:
        cmd = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-r", "-",
               "-i", str(patch)]
        if reverse:
            cmd[cmd.index("--forward")] = "--reverse"
        if dry_run:
            cmd.append("--dry-run")
        return cmd


def choose_tool(root: Path) -> Tool:
    """git apply where git exists, else GNU patch. Raises RuntimeError with neither, and
    ValueError when root lies inside a git work tree without being its top level (git
    apply would resolve the patch's paths against that top level)."""
    if shutil.which("git"):
        proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
        if proc.returncode == 0 and Path(proc.stdout.strip()).resolve() != root.resolve():
            raise ValueError(f"{root} is inside the git checkout {proc.stdout.strip()}: give the checkout's root")
        return GitApply(root)
    if shutil.which("patch"):
        return GnuPatch(root)
    raise RuntimeError("neither git nor patch is installed")


def patch_files(target: str, patches_dir: Path = PATCHES_DIR) -> list[Path]:
    """The target's patches in application order. Raises ValueError for an unknown
    target or a target folder without patches."""
    folder = patches_dir / target
    files = sorted(folder.glob("*.patch")) if folder.is_dir() else []
    if not files:
        known = sorted(p.name for p in patches_dir.iterdir() if p.is_dir() and any(p.glob("*.patch"))) \
            if patches_dir.is_dir() else []
        raise ValueError(f"no patches for {target!r} in {patches_dir} (targets: {', '.join(known) or 'none'}; "
                         "--patches-dir points at another patches/ folder)")
    return files


def upstream_of(patch: Path) -> str:
    """The ``Upstream:`` line of a patch's header (text before the first diff)."""
    with open(patch, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(("diff ", "--- ")):
                break
            if line.lower().startswith("upstream:"):
                return line.split(":", 1)[1].strip()
    return ""


def touched_files(patch: Path) -> list[str]:
    """The paths (relative to the checkout root) a patch modifies, from its ``+++ b/`` lines."""
    files = []
    with open(patch, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("+++ b/"):
                files.append(line[len("+++ b/"):].rstrip("\n").split("\t")[0])
    return files


def _megatron_lm_release(root: Path) -> tuple[str, list[str]]:
    from relax_straggler.integrations import megatron_compat

    return megatron_compat.tree_release(root)


def _megatron_lm_checks(root: Path, patched: Mapping[str, str]) -> list[str]:
    from relax_straggler.integrations import megatron_compat

    problems = megatron_compat.check_tree(root)
    training = patched.get(megatron_compat.TRAINING)
    if training is not None:
        problems += megatron_compat.check_patched_train(training)
    return problems


# target -> (checkout root) -> (the release found, as text; why the patches cannot serve it, empty if they can)
TARGET_RELEASES: Mapping[str, Callable[[Path], tuple[str, list[str]]]] = {"megatron-lm": _megatron_lm_release}
# target -> checks of (checkout root, {patched file: its patched text}); problems, empty if none
TARGET_CHECKS: Mapping[str, Callable[[Path, Mapping[str, str]], list[str]]] = {"megatron-lm": _megatron_lm_checks}


def verify(tool: Tool, target: str, patches: Sequence[Path], applied: bool) -> list[str]:
    """Why the patched checkout would not work, one message per problem (empty: it would).

    The patches are applied to a temporary copy of the files they touch (reverted, when
    `applied`: the checkout already holds them), then each patched Python file is verified
    (patch_verify.verify_file) and the target's checks run."""
    files = sorted({f for p in patches for f in touched_files(p)})
    with tempfile.TemporaryDirectory(prefix="relax-straggler-patch-") as tmp:
        copy = type(tool)(Path(tmp))
        for rel in files:
            if (tool.root / rel).is_file():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tool.root / rel, Path(tmp) / rel)
        for p in (reversed(patches) if applied else patches):
            ok, message = copy.apply(p, reverse=applied)
            if not ok:
                return [f"{p.name} does not apply to a copy of the files it touches: {message}"]
        texts = {rel: ((Path(tmp) / rel).read_text(encoding="utf-8"), (tool.root / rel).read_text(encoding="utf-8"))
                 for rel in files if rel.endswith(".py") and (tool.root / rel).is_file()}
    problems = []
    patched: dict[str, str] = {}
    for rel, (copied, original) in texts.items():
        before, after = (copied, original) if applied else (original, copied)
        patched[rel] = after
        problems += verify_file(rel, before, after)
    checks = TARGET_CHECKS.get(target)
    if checks is not None:
        problems += checks(tool.root, patched)
    return problems


def status(tool: Tool, patch: Path) -> PatchStatus:
    ok, message = tool.check(patch)
    if ok:
        return PatchStatus(patch, upstream_of(patch), State.APPLIES, "")
    if tool.check(patch, reverse=True)[0]:
        return PatchStatus(patch, upstream_of(patch), State.APPLIED, "")
    return PatchStatus(patch, upstream_of(patch), State.CONFLICTS, message)


def run(args: argparse.Namespace) -> int:
    """The command: logs what it does; with --format json / --json PATH also the result
    (target, path, mode, release, each patch's state, exit_status) as JSON."""
    result: dict = {"target": args.target, "path": args.path,
                    "mode": "check" if args.check else "revert" if args.revert else "apply", "release": "",
                    "patches": []}
    code = _run(args, result)
    if args.format == "json" or args.json_path:
        result["exit_status"] = code
        code = emit(args, result, lambda: None) or code
    return code


def _run(args: argparse.Namespace, result: dict) -> int:
    root = Path(args.path)
    if not root.is_dir():
        log.error("%s is not a directory", root)
        return 2
    try:
        files = patch_files(args.target, Path(args.patches_dir))
        tool = choose_tool(root)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    release, unserved = TARGET_RELEASES.get(args.target, lambda _: ("", []))(root)
    result["release"] = release
    if unserved and not args.revert:  # taking patches out is always allowed
        for problem in unserved:
            log.error("  %s", problem)
        log.error("%s: the patches cannot serve %s at %s (see above); nothing changed", args.target, release, root)
        return 1
    statuses = [status(tool, f) for f in files]
    result["patches"] = [{"patch": s.path.name, "state": s.state.value, "upstream": s.upstream, "detail": s.detail}
                         for s in statuses]
    for s in statuses:
        log.info("%-40s %s%s", s.path.name, s.state.value, f" (upstream {s.upstream})" if s.upstream else "")
        if s.detail:  # why a patch does not apply: as loud as the verdict it leads to
            (log.error if s.state is State.CONFLICTS else log.info)("  %s", s.detail.replace("\n", "\n  "))
    states = {s.state for s in statuses}
    if State.CONFLICTS in states:
        log.error("%s: %d of %d patches do not apply to %s%s (see above; patches/README.md lists the commits "
                  "they were verified on); nothing changed", args.target,
                  sum(s.state is State.CONFLICTS for s in statuses), len(statuses), root, f", {release}" if release else "")
        return 1
    if args.revert:  # taking patches out is always allowed, a broken one included
        return _apply(tool, [s.path for s in reversed(statuses) if s.state is State.APPLIED], reverse=True,
                      what="reverted", nothing="no patch is applied")
    if len(states) == 1:  # all apply, or all are applied: would the result work?
        problems = verify(tool, args.target, files, applied=states == {State.APPLIED})
        if problems:
            for problem in problems:
                log.error("  %s", problem)
            applied = states == {State.APPLIED}
            log.error("%s: the patches %s %s, but the patched code would not work there (see above); %s",
                      args.target, "are applied to" if applied else "apply to", root,
                      "--revert takes them out" if applied else "nothing changed")
            return 1
    if len(states) > 1:  # some applied, some not: neither checking nor applying can pass
        log.error("%s: only some patches are applied; revert them first (--revert)", args.target)
        return 1
    if args.check:
        return 0
    if states == {State.APPLIED}:
        log.info("%s: every patch is already applied", args.target)
        return 0
    return _apply(tool, [s.path for s in statuses], reverse=False, what="applied", nothing="")


def _apply(tool: Tool, files: Sequence[Path], reverse: bool, what: str, nothing: str) -> int:
    if not files:
        log.info("%s", nothing)
        return 0
    for f in files:
        ok, message = tool.apply(f, reverse=reverse)
        if not ok:
            log.error("%s failed on %s: %s", tool.name, f.name, message)
            return 1
        log.info("%s %s", what, f.name)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("patch", help="Apply, check or revert an integration patch (Relax, Megatron-LM).",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="Patch folder under patches/: relax or megatron-lm.")
    p.add_argument("path", help="Root of the framework's checkout.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="Only report whether each patch applies.")
    mode.add_argument("--revert", action="store_true", help="Take the applied patches out again.")
    p.add_argument("--patches-dir", default=str(PATCHES_DIR),
                   help="Folder holding the patch folders (default: this checkout's patches/).")
    add_output_arguments(p, text="the log of what it did, on stderr; nothing on stdout",
                         json_what="the result: each patch's state and the exit status")
    p.set_defaults(run=run)
