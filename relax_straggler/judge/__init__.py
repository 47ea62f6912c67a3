"""The judge: gathered rows in, one whole Report out (torch-free).

The metrics rank's report thread hands each sampled step's gathered rows to one Judge,
which owns everything judged across reports: the config each step is judged with
(runtime control changes thresholds from a step on), the per-step verdict
(relax_straggler.judge.report.build_report and the engine's per-step rule), the confirmed
verdict (started over when thresholds change) with its window evidence, kernel cause,
run-queue and GC evidence, and the live what-if. Nothing here imports torch.
"""

from relax_straggler.judge.judge import Judge

__all__ = ["Judge"]
