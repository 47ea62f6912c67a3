"""Writes the short Markdown result table of benchmarks/gpu/check.sh from OUT_DIR.

    python benchmarks/gpu/summarize.py OUT_DIR > OUT_DIR/summary.md

Reads steps.tsv (step, exit code, seconds), environment.log, tests.log, parity.json and
overhead.json; whatever is missing is reported as missing.
"""

from __future__ import annotations

import json
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

    overhead = _read_json(out / "overhead.json")
    if overhead is None:
        print("overhead: missing")
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


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gpu"))
