"""The code the integration patches insert, run: each shipped patch is applied to its
synthetic host (tests/python/fixtures/patch_hosts) and the host is run in a subprocess
with relax_straggler importable and not importable (``sys.modules["relax_straggler"] =
None``), with and without --straggler-analysis. Without relax_straggler the host must run
exactly as unpatched and fail with one clear message only when the flag is given."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relax_straggler.cli import main

REPO = Path(__file__).resolve().parents[2]
HOSTS = Path(__file__).resolve().parent / "fixtures" / "patch_hosts"

BLOCK = "import sys\nsys.modules['relax_straggler'] = None  # not installed\n"

RELAX_PARSE = """
import json
from relax.utils.arguments import parse_args
print(json.dumps(vars(parse_args()), sort_keys=True))
"""

MEGATRON_PARSE = """
import json
from megatron.training.arguments import parse_args
print(json.dumps(vars(parse_args()), sort_keys=True))
"""


def host(tmp_path: Path, target: str, patched: bool = True) -> Path:
    tree = tmp_path / ("patched" if patched else "unpatched") / target
    shutil.copytree(HOSTS / target, tree)
    if patched:
        assert main(["patch", target, str(tree)]) == 0
    return tree


def run_host(tree: Path, script: str, argv: list[str], importable: bool, **env: str) -> subprocess.CompletedProcess:
    """Runs `script` as a program on `tree`'s modules with command line `argv`."""
    code = ("" if importable else BLOCK) + script
    path = [str(tree)] + ([str(REPO)] if importable else [])
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1", **env))


def parsed(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target, script, argv", [
    ("relax", RELAX_PARSE, ["--ci-test"]),
    ("megatron-lm", MEGATRON_PARSE, ["--log-straggler", "--straggler-minmax-count", "2"]),
])
def test_arguments_without_relax_straggler_parse_as_unpatched(tmp_path, target, script, argv):
    unpatched = parsed(run_host(host(tmp_path, target, patched=False), script, argv, importable=False))
    assert parsed(run_host(host(tmp_path, target), script, argv, importable=False)) == unpatched


@pytest.mark.parametrize("target, script", [("relax", RELAX_PARSE), ("megatron-lm", MEGATRON_PARSE)])
def test_the_flag_without_relax_straggler_fails_naming_why(tmp_path, target, script):
    for flag in (["--straggler-analysis"], ["--straggler-analysis=true"]):
        proc = run_host(host(tmp_path / flag[0][-4:], target), script, flag, importable=False)
        assert proc.returncode != 0
        assert "ImportError: --straggler-analysis needs relax_straggler" in proc.stderr, proc.stderr
        assert "NameError" not in proc.stderr


@pytest.mark.parametrize("target, script, argv", [
    ("relax", RELAX_PARSE, []),
    ("megatron-lm", MEGATRON_PARSE, ["--log-straggler", "--straggler-minmax-count", "2"]),
])
def test_arguments_with_relax_straggler(tmp_path, target, script, argv):
    tree = host(tmp_path, target)
    off = parsed(run_host(tree, script, argv, importable=True))
    if target == "megatron-lm":  # no flag, no import: parsed as unpatched
        assert off == parsed(run_host(host(tmp_path, target, patched=False), script, argv, importable=True))
    else:
        assert off["straggler_analysis"] is False
    on = parsed(run_host(tree, script, [*argv, "--straggler-analysis", "--straggler-interval", "3"], importable=True))
    assert on["straggler_analysis"] is True and on["straggler_interval"] == 3
    if target == "megatron-lm":  # beside Megatron-LM's own straggler-detector flags
        assert on["log_straggler"] is True and on["straggler_minmax_count"] == 2


MEGATRON_PARSE_IMPORTS = """
import sys
from megatron.training.arguments import parse_args
parse_args()
print(sorted(m for m in sys.modules if m.split('.')[0] == 'relax_straggler'))
"""


def test_megatron_lm_argument_parsing_imports_nothing_of_relax_straggler_without_the_flag(tmp_path):
    tree = host(tmp_path, "megatron-lm")
    off = run_host(tree, MEGATRON_PARSE_IMPORTS, ["--log-straggler"], importable=True)
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == "[]"
    on = run_host(tree, MEGATRON_PARSE_IMPORTS, ["--straggler-analysis"], importable=True)
    assert on.returncode == 0, on.stderr
    assert "'relax_straggler.integrations.megatron_lm'" in on.stdout


RELAX_TRAIN = """
import json, logging, os, sys
logging.basicConfig(level=logging.INFO)
from argparse import Namespace
import torch
from relax.backends.megatron import model as backend

on = sys.argv[1:] == ["on"]
args = Namespace(ci_test=False, enable_mtp_training=False, allgather_cp=False, fixture_forward_sleep_s=0.002,
                 use_distributed_optimizer=False, overlap_param_gather=False)
if on:
    from relax.utils.arguments import parse_args
    sys.argv = [sys.argv[0], "--straggler-analysis", "--straggler-interval", "1", "--straggler-warmup-steps", "0"]
    vars(args).update(vars(parse_args()))
torch.manual_seed(0)
model = [backend.make_model(args)]
optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
batches = iter([torch.full((2, 4), float(i)) for i in range(100)])
for rollout_id in range(2):
    backend.train(rollout_id, model, optimizer, batches, [2, 2, 2])
if on:
    from relax_straggler.integrations import relax
    relax.detach()
print(json.dumps({"weight": model[0].weight.sum().item(), "timers": type(model[0].config.timers).__name__,
                  "profiler_calls": len(backend.ProfilerTimers.calls)}))
"""

# What Relax's own profiler publishes (relax/utils/straggler/reporter.py and detector.py, by
# Relax version): the second path component of its straggler/* names, and its own prefix.
RELAX_PROFILER_GROUPS = {"fwd", "bwd", "optim", "pp_recv", "pp_send", "dp_grad_sync", "dp_param_gather", "lp_fwd",
                         "lp_pp_recv", "lp_pp_send", "self", "wait", "self_per_ktok", "late", "latency", "health",
                         "flagged", "tokens", "pp_stage_imbalance", "self_overhead_ms", "dropped_events"}
RELAX_PROFILER_NAMES = {"straggler/window/first_rollout", "straggler/window/last_rollout"}


def test_relax_backend_without_relax_straggler_trains_as_unpatched(tmp_path):
    unpatched = parsed(run_host(host(tmp_path, "relax", patched=False), RELAX_TRAIN, [], importable=False))
    assert parsed(run_host(host(tmp_path, "relax"), RELAX_TRAIN, [], importable=False)) == unpatched


def test_relax_backend_with_the_analysis(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    tree = host(tmp_path, "relax")
    off = parsed(run_host(tree, RELAX_TRAIN, [], importable=True, RELAX_FIXTURE_METRICS=str(metrics)))
    on = parsed(run_host(tree, RELAX_TRAIN, ["on"], importable=True, RELAX_FIXTURE_METRICS=str(metrics)))
    assert on == off and on["timers"] == "NoneType"  # same weights; config.timers is None again after the steps
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["train/step"] for r in rows] == list(range(6))  # rollout_id * steps_per_rollout + step_id
    assert all(r["step_key"] == "train/step" and r["straggler/forward/local_ms"] > 0 for r in rows)


MEGATRON_TRAIN = """
import json, os, sys, time
import torch
from megatron.training import global_vars, training
from megatron.training.arguments import parse_args


class Timer:
    def start(self, barrier=False):
        pass

    def stop(self, barrier=False):
        pass


class Timers:  # Megatron-LM's global Timers, recording the names it is asked for
    def __init__(self):
        self.names = []

    def __call__(self, name, log_level=None):
        self.names.append(name)
        return Timer()


def forward_step(data_iterator, model):  # pretrain_gpt.forward_step's shape
    timers = global_vars.get_timers()
    timers('batch-generator', log_level=2).start()
    batch = next(data_iterator)
    time.sleep(0.01)
    timers('batch-generator').stop()
    return model(batch).pow(2).mean()


args = parse_args()
vars(args).update(train_iters=6, exit_interval=int(os.environ.get("FIXTURE_EXIT_INTERVAL", "0")),
                  fixture_microbatches=2, fixture_cuda_graphs=False)
timers = Timers()
global_vars.set_global_variables(args, timers)
torch.manual_seed(0)
model = [torch.nn.Linear(4, 4)]
optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)
config = type('Config', (), {'timers': None})()
original_step = training.train_step
data = iter([torch.full((2, 4), float(i)) for i in range(100)])


def report():
    print(json.dumps({"weight": model[0].weight.sum().item(), "restored": training.train_step is original_step,
                      "global_timers": global_vars.get_timers() is timers, "names": sorted(set(timers.names))}))


try:
    training.train(forward_step, model, optimizer, None, data, config)
except SystemExit:
    report()
    raise
report()
"""

MEGATRON_FLAGS = ["--straggler-interval", "1", "--straggler-warmup-steps", "0"]


@pytest.mark.parametrize("exit_interval", ["0", "4"])  # 4: train() leaves through sys.exit(0)
def test_megatron_lm_without_relax_straggler_trains_as_unpatched(tmp_path, exit_interval):
    unpatched = run_host(host(tmp_path, "megatron-lm", patched=False), MEGATRON_TRAIN, [], importable=False,
                         FIXTURE_EXIT_INTERVAL=exit_interval)
    patched = run_host(host(tmp_path, "megatron-lm"), MEGATRON_TRAIN, [], importable=False,
                       FIXTURE_EXIT_INTERVAL=exit_interval)
    assert unpatched.returncode == 0, unpatched.stderr
    assert (patched.returncode, patched.stdout) == (unpatched.returncode, unpatched.stdout), patched.stderr


@pytest.mark.parametrize("exit_interval", [0, 4])  # 4: train() leaves through sys.exit(0)
def test_megatron_lm_flushes_on_every_exit_and_times_the_data_stage(tmp_path, exit_interval):
    jsonl = tmp_path / "reports.jsonl"
    tree = host(tmp_path, "megatron-lm")
    env = {"FIXTURE_EXIT_INTERVAL": str(exit_interval)}
    off = run_host(tree, MEGATRON_TRAIN, [], importable=True, **env)
    on = run_host(tree, MEGATRON_TRAIN, ["--straggler-analysis", "--straggler-jsonl", str(jsonl), *MEGATRON_FLAGS],
                  importable=True, **env)
    assert on.returncode == off.returncode == 0, on.stderr
    result = json.loads(on.stdout.strip().splitlines()[-1])
    assert result == json.loads(off.stdout.strip().splitlines()[-1])  # same weights, same timers logged
    assert result["restored"] and result["global_timers"]
    assert {"batch-generator", "optimizer", "forward-compute"} <= set(result["names"])  # chained through
    reports = [json.loads(line) for line in jsonl.read_text().splitlines()]
    logged = [int(m) for m in re.findall(r"^iteration (\d+)/", on.stdout, re.M)]
    assert logged == list(range(1, (exit_interval or 6) + 1))
    assert [r["step"] for r in reports] == logged  # numbered as Megatron-LM logs them; the last one flushed
    for r in reports:
        stages = dict(zip(r["stages"], r["device_ms"][0]))
        assert stages["data"] >= 2 * 10 * 0.8  # two batch-generator sections of 10 ms, from get_timers()
        assert stages["optimizer"] is not None and stages["forward"] >= stages["data"]


def test_relax_backend_beside_relax_s_own_profiler(tmp_path):
    """Relax's profiler keeps getting every timer call once (ours is chained in front of it
    inside training steps, and its timers are back in config.timers after each), and the
    two publish different names."""
    metrics = tmp_path / "metrics.jsonl"
    tree = host(tmp_path, "relax")
    env = {"RELAX_FIXTURE_METRICS": str(metrics), "RELAX_STRAGGLER_PROFILER": "1"}
    off = parsed(run_host(tree, RELAX_TRAIN, [], importable=True, **env))
    on = run_host(tree, RELAX_TRAIN, ["on"], importable=True, **env)
    assert parsed(on) == off and off["timers"] == "ProfilerTimers" and off["profiler_calls"] == 2 * 3 * 2 * 4
    assert "Relax's own straggler profiler is on too" in on.stderr
    names = {k for line in metrics.read_text().splitlines() for k in json.loads(line) if k.startswith("straggler/")}
    assert names and not names & RELAX_PROFILER_NAMES
    assert not {n.split("/")[1] for n in names} & RELAX_PROFILER_GROUPS
