"""The collective layer never stops training: a group it cannot wrap is left untimed, a
torch whose private group registry moved installs without the layer (one warning each)."""

import json
import subprocess
import sys

from conftest import REPO

SCRIPT = r"""
import json, logging, os, sys, tempfile
import torch, torch.distributed as dist
from relax_straggler import StragglerConfig
from relax_straggler.live import collectives
import relax_straggler

fault = sys.argv[1]
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
if fault == "registry":
    def moved():
        raise RuntimeError("relax_straggler: cannot list process groups on this torch version")
    collectives.group_registry = moved
analyzer = relax_straggler.install(None, config=StragglerConfig(enabled=True, interval=1, warmup_steps=0,
                                                                 console=False))
if fault == "wrap":
    real = collectives.ext()
    class Ext:  # the extension, except that wrapping a group raises
        def __getattr__(self, name):
            return getattr(real, name)
        def wrap_process_group(self, *a):
            raise RuntimeError("this backend cannot be wrapped")
    collectives.ext = lambda fake=Ext(): fake
x = torch.ones(3)
out = {"layer": analyzer._collectives is not None}
for step in range(3):
    if step == 1:
        g = dist.new_group([0])
    with analyzer.section("forward"):
        dist.all_reduce(x)
    if step >= 1:
        dist.all_reduce(x, group=g)
    analyzer.step()
out["trained"] = step + 1
out["x"] = x.tolist()
analyzer.uninstall()
print(json.dumps(out))
"""


def run(fault: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, fault], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_a_group_the_layer_cannot_wrap_is_left_untimed_and_training_goes_on():
    out, err = run("wrap")
    assert out["layer"] and out["trained"] == 3 and out["x"] == [1.0, 1.0, 1.0]
    assert err.count("cannot time process group") == 1, err[-3000:]


def test_a_moved_group_registry_installs_without_the_collective_layer():
    out, err = run("registry")
    assert not out["layer"] and out["trained"] == 3
    assert err.count("without the collective layer") == 1, err[-3000:]
