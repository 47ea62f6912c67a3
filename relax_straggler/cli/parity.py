"""`relax-straggler parity`: proves that the analyzer leaves training bitwise unchanged.

    relax-straggler parity                         # demo GPT, one process
    relax-straggler parity --nproc 2               # demo GPT under DDP on 2 Gloo ranks
    relax-straggler parity --script train.py:make  # your training (docs/PARITY.md)

Runs the training with the analyzer off, off again (control) and on at each
--intervals value, compares every step's loss and the final parameters and optimizer
state bit for bit, prints a verdict table (or, with --format json, the result) and exits 0
(identical), 1 (a run with the analyzer differs), 2 (bad arguments, or a script, device
or option that cannot run) or 3 (the baseline is not deterministic, so nothing can be
concluded).

With --nproc N > 1 and no torchrun around it, the command starts itself under
`torch.distributed.run --standalone` with N ranks (Gloo); rank 0 prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=30, help="Training steps per run.")
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 10], metavar="K",
                   help="Sampling intervals of the analyzer-on runs (each samples from step 0).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--script", type=str, default=None, metavar="PATH[:FACTORY]",
                   help="Your training: a file defining FACTORY(seed) -> ParityTraining "
                        "(default name parity_training). Default: the demo GPT.")
    p.add_argument("--nproc", type=int, default=1, help="Ranks (Gloo, 127.0.0.1); > 1 starts torchrun.")
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="Skip the second analyzer-off run that proves the baseline is deterministic.")
    p.add_argument("--no-module-stages", dest="module_stages", action="store_false",
                   help="Do not time attention / MoE modules in the analyzer-on runs.")
    p.add_argument("--deterministic", action="store_true",
                   help="Deterministic algorithms where torch has them (needed on CUDA; sets "
                        "CUBLAS_WORKSPACE_CONFIG).")
    p.add_argument("--json", type=str, default=None, metavar="PATH", help="Also write the result as JSON.")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="What stdout gets: text (the verdict table) or json (the result); default text.")
    demo = p.add_argument_group("demo model (without --script; defaults: the demo's)")
    demo.add_argument("--layers", type=int, default=4)
    demo.add_argument("--d-model", type=int, default=128)
    demo.add_argument("--heads", type=int, default=4)
    demo.add_argument("--seq-len", type=int, default=64)
    demo.add_argument("--batch-size", type=int, default=8)
    demo.add_argument("--device", type=str, default="cpu",
                      help="cpu, cuda, or cuda:N (cuda: each rank on GPU LOCAL_RANK).")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("parity", help="A/B check: losses and parameters bitwise equal with the analyzer on/off.",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(run=run)


def _forwarded_argv(args: argparse.Namespace) -> list[str]:
    """The same options, for the ranks that torchrun starts (each runs with --nproc 1)."""
    argv = ["--steps", str(args.steps), "--intervals", *map(str, args.intervals), "--seed", str(args.seed),
            "--layers", str(args.layers), "--d-model", str(args.d_model), "--heads", str(args.heads),
            "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--device", args.device]
    if args.script:
        argv += ["--script", str(Path(args.script.partition(":")[0]).resolve()) +
                 (":" + args.script.partition(":")[2] if ":" in args.script else "")]
    if not args.control:
        argv.append("--no-control")
    if not args.module_stages:
        argv.append("--no-module-stages")
    if args.deterministic:
        argv.append("--deterministic")
    if args.json:
        argv += ["--json", str(Path(args.json).resolve())]
    if args.format != "text":
        argv += ["--format", args.format]
    if getattr(args, "verbose", False):
        argv.append("--verbose")
    return argv


def _launch(args: argparse.Namespace) -> int:
    """Runs the check on args.nproc ranks under torchrun; returns the verdict's exit code."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="relax-straggler-parity-") as tmp:
        result_json = Path(args.json).resolve() if args.json else Path(tmp) / "parity.json"
        if result_json.exists():
            result_json.unlink()
        forwarded = argparse.Namespace(**{**vars(args), "json": str(result_json)})
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               "-m", "relax_straggler.cli.parity", *_forwarded_argv(forwarded)]
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        log.debug("starting %s", " ".join(cmd))
        code = subprocess.run(cmd, env=env, check=False).returncode
        # torchrun turns any failing rank into exit code 1; the verdict's own code (0, 1
        # or 2) is read back from rank 0's JSON.
        if not result_json.exists():
            return code or 1
        verdict = json.loads(result_json.read_text())
    from relax_straggler.demo import parity

    if not verdict["deterministic"]:
        return parity.EXIT_NONDETERMINISTIC
    return parity.EXIT_IDENTICAL if verdict["passed"] else parity.EXIT_DIFFERENT


def run(args: argparse.Namespace) -> int:
    """Entry point of the subcommand; returns the process exit code."""
    if args.steps < 1 or args.nproc < 1:
        log.error("--steps and --nproc must be >= 1")
        return 2
    if args.nproc > 1 and "RANK" not in os.environ:
        return _launch(args)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    import torch
    import torch.distributed as dist

    from relax_straggler.demo import parity

    if args.deterministic:
        # warn_only: an op without a deterministic kernel warns instead of raising, and the
        # control run then shows whether the baseline repeats itself.
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started_group = False
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
        started_group = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    try:
        if args.script:
            factory = parity.load_factory(args.script)
        else:
            device = args.device
            if device == "cuda":
                device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
            if device.startswith("cuda"):
                torch.cuda.set_device(torch.device(device))
            from relax_straggler.demo import DemoSpec, demo_factory

            factory = demo_factory(DemoSpec(layers=args.layers, d_model=args.d_model, heads=args.heads,
                                            seq_len=args.seq_len, batch_size=args.batch_size, device=device))
        result = parity.run_parity(factory, steps=args.steps, intervals=args.intervals, seed=args.seed,
                                   control=args.control, module_stages=args.module_stages)
    except (ValueError, OSError, ImportError, RuntimeError, AttributeError) as exc:
        # A bad option, script or device: exit 2, never 1 ("the analyzer changed the run").
        log.error("parity could not run: %s: %s", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return 2
    finally:
        if started_group:
            gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
            dist.destroy_process_group()
    if rank == 0:
        if args.format == "json":
            print(json.dumps(result.to_dict(), indent=2))
        else:
            _print(result)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(result.to_dict(), indent=2))
    return result.exit_code


def _print(result) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"loss parity: {result.steps} steps, seed {result.seed}, {result.world_size} rank(s)")
    table.add_column("run", no_wrap=True)
    for col in ("sampled steps", "reports", "equal losses", "equal tensors", "max |Δ|"):
        table.add_column(col, justify="right")
    table.add_column("verdict", no_wrap=True)
    rows = ([result.control] if result.control else []) + list(result.runs)
    for r in rows:
        total = r.steps * result.world_size
        verdict = "[green]identical[/]" if r.identical else (
            f"[red]differs @{r.first_mismatch_step}[/]" if r.first_mismatch_step is not None else "[red]differs[/]")
        table.add_row(r.name, str(r.sampled_steps), str(r.reports), f"{total - r.loss_mismatches}/{total}",
                      f"{r.tensors_compared - len(r.tensor_mismatches)}/{r.tensors_compared}",
                      f"{max(r.max_loss_abs_diff, r.max_tensor_abs_diff):.2g}", verdict)
    console = Console()
    console.print(table)
    for r in rows:
        for name in r.tensor_mismatches[:5]:
            console.print(f"  {r.name}: {name} differs")
    if not result.deterministic:
        console.print("[yellow]NOT DECIDABLE[/]: the baseline is not deterministic (the two analyzer-off runs "
                      "differ); try --deterministic, fixed thread counts, or a script without nondeterministic ops")
    elif result.passed:
        console.print("[green]PASS[/]: bitwise identical losses and final state with the analyzer on and off")
    else:
        console.print("[red]FAIL[/]: the analyzer changed the training's numbers")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m relax_straggler.cli.parity` (what torchrun runs on each rank)."""
    p = argparse.ArgumentParser(prog="relax-straggler parity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    add_arguments(p)
    args = p.parse_args(argv)
    from relax_straggler.cli.common import LogFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter("%(message)s"))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
