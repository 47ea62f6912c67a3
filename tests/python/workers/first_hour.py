"""Worker for test_first_hour: what a new user sees on 2 Gloo ranks (torchrun).

Usage: first_hour.py MODE OUT_DIR
MODE:
  readme          runs README.md's first Python snippet as it is written (model, optimizer,
                  loader, loss_fn and num_steps defined here), 200 steps under DDP
  install-one     only rank 0 calls install() (join timeout JOIN_TIMEOUT_S); both train on
  uninstall-one   both install; rank 0 calls uninstall() alone, rank 1 only once rank 0 returned
Each rank writes OUT_DIR/rank{R}.json: its step times (s) and, where it applies, the error
install() raised, the seconds install() / uninstall() took and the relax_straggler errors
and warnings it logged.
"""

import json
import logging
import pathlib
import re
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import relax_straggler
from relax_straggler import StragglerConfig
from step_times import StepClock  # beside this file
from warnings_log import Warnings

REPO = pathlib.Path(__file__).resolve().parents[3]
JOIN_TIMEOUT_S = 3.0
STEPS = 20


def readme_snippet() -> str:
    """The first ```python block of README.md."""
    return re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, clock: StepClock) -> None:
    for _ in range(steps):
        with clock:
            loss = model(torch.randn(8, 16)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def main() -> None:
    mode, out = sys.argv[1], pathlib.Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    clock = StepClock()
    logged = Warnings()
    if mode != "readme":  # the snippet runs in a process that configured no logging, as a new user's does
        logging.getLogger("relax_straggler").addHandler(logged)
    result: dict = {}
    if mode == "readme":
        model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        optimizer.register_step_post_hook(lambda *_: clock.lap())
        loader = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(200)]
        loss_fn, num_steps = nn.functional.mse_loss, 200
        clock.start()
        exec(readme_snippet(), {"model": model, "optimizer": optimizer, "loader": loader, "loss_fn": loss_fn,
                                "num_steps": num_steps})
    elif mode == "install-one":
        model = nn.Linear(16, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        if rank == 0:
            began = time.monotonic()
            try:
                relax_straggler.install(model, optimizer,
                                        config=StragglerConfig(enabled=True, join_timeout_s=JOIN_TIMEOUT_S))
            except RuntimeError as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
            result["install_s"] = time.monotonic() - began
        train(model, optimizer, STEPS, clock)
    elif mode == "uninstall-one":
        model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        analyzer = relax_straggler.install(model, optimizer, config=StragglerConfig(
            enabled=True, interval=2, warmup_steps=2, join_timeout_s=JOIN_TIMEOUT_S, quiet=True))
        train(model, optimizer, STEPS, clock)
        store = dist.distributed_c10d._get_default_store()
        if rank == 1:
            store.wait(["rank0-uninstalled"])
        began = time.monotonic()
        analyzer.uninstall(timeout_s=2 * JOIN_TIMEOUT_S)
        result["uninstall_s"] = time.monotonic() - began
        if rank == 0:
            store.set("rank0-uninstalled", "1")
    result["logged"] = logged.lines
    result["step_s"] = clock.times
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
