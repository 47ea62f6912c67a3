"""The report thread imports nothing once training runs: an import holds the GIL for long
stretches (numpy.ma, which np.median loads on first use, took 100-170 ms), and the metrics
rank's training thread waits for it, which its own stage times then show as a straggler."""

import subprocess
import sys

# In a fresh interpreter (pytest has imported much already): what install() imports, then
# reports of four ranks, healthy ones first (the analysis is warm), then rank 1 slow in
# forward, waiting for a CPU, with kernel records, until it is confirmed.
SCRIPT = r"""
import sys
import numpy as np
from relax_straggler.common.payload import KernelMatrix
from relax_straggler.judge.confirm import ConfirmedVerdict
import relax_straggler.live.analyzer

rng = np.random.default_rng(0)
verdict = ConfirmedVerdict()
stages = ("forward", "backward")
def report(step, slow):
    ms = 50.0 * (1 + 0.01 * rng.standard_normal((4, 2)))
    wait = 2.0 + 0.2 * rng.standard_normal(4)
    if slow:
        ms[1, 0] += 20.0
        wait[1] += 15.0
    kernel = KernelMatrix(kernel_ms=ms * 0.8, idle_ms=ms * 0.2, nccl_ms=np.zeros_like(ms))
    return verdict.update(step, ms, stages, run_queue_ms=wait, kernel=kernel)
for step in range(3):
    report(step, False)
warm = set(sys.modules)
for step in range(3, 12):
    result = report(step, True)
    for f in result.findings:
        f.describe()
assert any(f.state == "straggler" for f in result.findings), result.findings
print(sorted(set(sys.modules) - warm))
"""


def test_the_first_finding_imports_no_module():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
