"""Writes the short Markdown result table of benchmarks/gpu/check.sh from OUT_DIR.

    python benchmarks/gpu/summarize.py OUT_DIR > OUT_DIR/summary.md

Reads steps.tsv (step, exit code, seconds), environment.log, tests.log, parity.json,
overhead.json, kernel_stats.json (benchmarks/gpu/kernel_check.py) and kernel_overhead.json
(benchmarks/overhead.py with and without kernel stats); whatever is missing is reported as
missing.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_line(path: Path, contains: str) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text().splitlines() if contains in ln]
    except OSError:
        return "missing"
    return lines[-1] if lines else "missing"


def _tail(path: Path) -> str:
    """The last non-empty line of a step's log (why its JSON is missing), or "no log"."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "an empty log"


def main(out: Path) -> None:
    print("# relax_straggler GPU check\n")
    env = (out / "environment.log").read_text().strip() if (out / "environment.log").exists() else "missing"
    print("```\n" + env + "\n```\n")
    print("| step | exit code | seconds |\n|---|---|---|")
    if (out / "steps.tsv").exists():
        for line in (out / "steps.tsv").read_text().splitlines():
            name, rc, secs = line.split("\t")
            print(f"| {name} | {rc}{'' if rc == '0' else ' FAILED'} | {secs} |")
    print(f"\ntests: {_last_line(out / 'tests.log', ' in ')}\n")

    parity = _read_json(out / "parity.json")
    if parity is None:
        print("parity: missing\n")
    else:
        verdict = "PASS (bitwise identical)" if parity["passed"] else (
            "NOT DECIDABLE (baseline not deterministic)" if not parity["deterministic"] else "FAIL")
        runs = "; ".join(f"{r['name']}: {r['sampled_steps']} sampled, {r['loss_mismatches']} loss / "
                         f"{len(r['tensor_mismatches'])} tensor mismatches" for r in parity["runs"])
        print(f"parity on CUDA, {parity['steps']} steps: {verdict}; {runs}\n")

    _overhead(out)
    _kernel_stats(out)
    _kernel_overhead(out)


def _overhead(out: Path) -> None:
    overhead = _read_json(out / "overhead.json")
    if overhead is None:
        print("overhead: missing\n")
        return
    m = overhead["model"]
    print(f"overhead: {overhead['device']}, {overhead['world_size']} rank(s), GPT {m['layers']} layers x "
          f"d{m['d_model']}, seq {m['seq_len']}, batch {m['batch_size']}; {overhead['rounds']} rounds of "
          f"{overhead['steps']} steps\n")
    print("| variant | ms/step | wall ratio | 95 % CI | per 100 steps |\n|---|---|---|---|---|")
    for r in overhead["rows"]:
        lo, hi = r["wall_ci95"]
        counters = ", ".join(f"{k} {v:g}" for k, v in r["counters_per_100_steps"].items()
                             if k in ("read_points", "synchronize_calls", "gathers", "reports"))
        print(f"| {r['variant']} | {r['wall_ms_per_step']:.2f} | {r['wall_ratio']:.4f} | [{lo:.4f}, {hi:.4f}] | "
              f"{counters} |")
    print()


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _kernel_cell(per_rank: dict | None, stage: str) -> str:
    """kernel / idle / nccl ms of one rank's stage, "-" where not measured."""
    fields = (per_rank or {}).get(stage)
    return "-" if fields is None else " / ".join(_ms(fields.get(k)) for k in ("kernel_ms", "idle_ms", "nccl_ms"))


def _kernel_stats(out: Path) -> None:
    ks = _read_json(out / "kernel_stats.json")
    if ks is None:
        print(f"kernel stats: missing (kernel_stats.log ends: {_tail(out / 'kernel_stats.log')})\n")
        return
    m = ks["model"]
    print(f"kernel stats: {ks['device']}, {ks['world_size']} ranks, GPT {m['layers']} layers x d{m['d_model']}, "
          f"seq {m['seq_len']}, batch {m['batch_size']}; {ks['steps']} steps, interval {ks['interval']}; rank "
          f"{ks['contend_rank']} runs {ks['contend_size']}^2 matmuls on a second stream from step "
          f"{ks['contend_from']}\n")
    if ks["failure"] is not None:
        print(f"kernel stats NOT MEASURED: {ks['failure']}\n")
    causes = ", ".join(ks["rank1_causes"]) or "none (never confirmed)"
    print(f"verdict's cause seen for rank 1: {causes}; confirmed from step {ks['confirmed_rank1_from_step']}\n")
    print("| rank | mode | measured / sampled steps | records | dropped | invalid | unattributed | "
          "step ms before / after |\n|---|---|---|---|---|---|---|---|")
    for r in ks["ranks"]:
        print(f"| {r['rank']} | {r['mode']} | {r['measured_steps']} / {r['sampled_steps']} | {r['records']} | "
              f"{r['dropped_records']} | {r['invalid_records']} | {r['unattributed_records']} | "
              f"{_ms(r['step_ms_before'])} / {_ms(r['step_ms_after'])} |")
    print("\nper report, kernel / idle / nccl ms of each rank's own records:\n")
    print("| step | status | rank | stage | cause | forward r0 | forward r1 | backward r0 | backward r1 |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in ks["reports"]:
        cells = [_kernel_cell(r["per_rank"].get(str(rank)), stage) for stage in ("forward", "backward")
                 for rank in (0, 1)]
        verdict = " | ".join(str(r[k]) for k in ("step", "status", "rank", "stage", "cause"))
        print(f"| {verdict} | " + " | ".join(cells) + " |")
    last = (ks["reports"][-1]["per_rank"].get("1") or {}).get("forward") if ks["reports"] else None
    if last and last.get("top"):  # the competitor's matmuls show here when they count as forward's
        tops = "; ".join(f"{name} {ms:.2f} ms x{calls}" for name, ms, calls in last["top"])
        print(f"\nrank 1's top forward kernels, step {ks['reports'][-1]['step']}: {tops}")
    print()


def _kernel_overhead(out: Path) -> None:
    ko = _read_json(out / "kernel_overhead.json")
    if ko is None:
        print(f"kernel stats overhead: missing (kernel_overhead.log ends: {_tail(out / 'kernel_overhead.log')})")
        return
    warned = _distinct_lines(out / "kernel_overhead.log", "relax_straggler: ")
    blocks = {name: [b["wall_ms"] for b in bs] for name, bs in ko["blocks"].items()}
    rows = {r["variant"]: r for r in ko["rows"]}
    print(f"kernel stats overhead: {ko['device']}, {ko['world_size']} rank(s), {ko['rounds']} rounds of "
          f"{ko['steps']} steps, no competing stream\n")
    print("| variant | ms/step (median of rounds) | wall ratio to bare |\n|---|---|---|")
    for name in ("bare", "off", "ours/10", "ours-kernel-stats/10"):
        if name in rows:
            print(f"| {name} | {rows[name]['wall_ms_per_step']:.2f} | {rows[name]['wall_ratio']:.4f} |")
    for a, b in (("ours/10", "off"), ("ours-kernel-stats/10", "off"), ("ours-kernel-stats/10", "ours/10")):
        if a in blocks and b in blocks:
            print(f"\n{a} against {b}: {100 * (_median_ratio(blocks[a], blocks[b]) - 1):+.1f} % step time "
                  "(median over rounds)")
    for line in warned:  # e.g. kernel stats not measured in some block
        print(f"\nwarning in kernel_overhead.log: {line}")


def _distinct_lines(path: Path, contains: str, most: int = 3) -> list[str]:
    """The first `most` distinct lines of `path` holding `contains` ([] without the file)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if contains in ln]
    except OSError:
        return []
    return list(dict.fromkeys(lines))[:most]


def _median_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[r] / b[r] (the blocks of one round ran side by side)."""
    return statistics.median(x / y for x, y in zip(a, b))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gpu"))
