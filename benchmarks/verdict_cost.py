"""What the confirmed verdict adds to a report on the metrics rank, end to end in Python.

Per report the live analyzer judges the gathered rows (relax_straggler.judge.report.build_report:
unpack, the per-step RFC verdict judge_step, the metrics) and then feeds the judged matrix
to the confirmed verdict (relax_straggler.judge.confirm.ConfirmedVerdict.update: the tracker, and
every `window_every` reports the window ensemble over the last `window_size`). This times
both on the same synthetic rows (5 core stages of ~40 ms with 1.5 % jitter, one rank 30 %
slower in forward) for a job judged as one group and within pipeline stages, with the
default settings (StragglerConfig()): the confirmed verdict's cost per report with the
ensemble amortised over its reports, and without it.

    .venv/bin/python benchmarks/verdict_cost.py [--ranks 1024] [--reports 100]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from relax_straggler import StragglerConfig
from relax_straggler.common.payload import pack, unpack
from relax_straggler.common.stages import STAGE_IDS, STAGES
from relax_straggler.judge.columns import all_stages
from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict
from relax_straggler.judge.report import build_report

CORE = ("forward", "backward", "optimizer", "communication", "data")


def rows(ranks: int, per_group: int, step: int, rng: np.random.Generator) -> np.ndarray:
    """(ranks, ROW_LEN) gathered rows of one sampled step."""
    out = []
    for r in range(ranks):
        device = np.full(len(STAGES), np.nan)
        for s in CORE:
            device[STAGE_IDS[s]] = 40.0 * np.exp(0.015 * rng.standard_normal())
        if r == 7:
            device[STAGE_IDS["forward"]] *= 1.3
        zeros = np.where(np.isnan(device), np.nan, 0.0)
        group = r // per_group if per_group else None
        out.append(pack(step, np.nan, r, device, device, zeros, np.where(np.isnan(device), np.nan, 1.0), (), group,
                        float(step)))
    return np.stack(out)


def per_report_us(ranks: int, per_group: int, reports: int, window: bool) -> tuple[float, float]:
    """(build_report, confirmed verdict) median us per report over `reports` reports."""
    config = StragglerConfig(enabled=True)
    confirm = ConfirmConfig.from_config(config)
    if not window:
        confirm = ConfirmConfig(**{**confirm.__dict__, "window_every": 0})
    verdict = ConfirmedVerdict(confirm)
    rng = np.random.default_rng(0)
    judge, confirmed = [], []
    for step in range(reports):
        gathered = unpack(rows(ranks, per_group, step, rng))
        t0 = time.perf_counter()
        report = build_report(gathered, step, config, 0, {})
        t1 = time.perf_counter()
        verdict.update(report.step, all_stages(report.judged_ms, report.stages), STAGES, groups=report.groups)
        t2 = time.perf_counter()
        judge.append(t1 - t0)
        confirmed.append(t2 - t1)
    # Means over the reports past the window's first analysis: the ensemble runs on 1 in 10.
    skip = min(reports // 2, 20)
    return 1e6 * float(np.mean(judge[skip:])), 1e6 * float(np.mean(confirmed[skip:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--reports", type=int, default=100)
    args = p.parse_args()
    print("| ranks, comparison groups | build_report | confirmed verdict, tracker | share | "
          "with the window ensemble (1 report in 10) | share |")
    print("|---|---|---|---|---|---|")
    for per_group, label in ((0, "one group"), (128, "pipeline stages of 128"), (8, "pipeline stages of 8")):
        judge, tracker = per_report_us(args.ranks, per_group, args.reports, window=False)
        _, full = per_report_us(args.ranks, per_group, args.reports, window=True)
        print(f"| {args.ranks:,}, {label} | {judge:.0f} us | {tracker:.0f} us | {100 * tracker / judge:.0f} % | "
              f"{full:.0f} us | {100 * full / judge:.0f} % |")


if __name__ == "__main__":
    main()
