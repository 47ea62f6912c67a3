"""The readable terminal report of an analysis summary (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from relax_straggler.analysis.findings import format_ranks
from relax_straggler.readers.base import problems_line

TOP_RANKS = 10
STATUS_STYLE = {"stragglers": "bold red", "imbalance": "bold yellow", "clean": "bold green", "inconclusive": "bold"}


def _ms(x) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _anomaly_table(title: str, anomalies: list[dict]) -> Table:
    table = Table(title=title, title_justify="left", expand=True)
    for col in ("kind", "where", "ranks", "nodes", "stages", "steps", "mean ratio", "excess ms"):
        table.add_column(col, justify="right" if col in ("steps", "mean ratio", "excess ms") else "left")
    for a in anomalies:
        where = " / ".join(f"{k} {a[v]}" for k, v in (("dp", "dp_rank"), ("pp", "pp_rank")) if a[v] is not None)
        table.add_row(a["kind"], where, format_ranks(a["ranks"]), format_ranks(a["nodes"]) or "-",
                      ", ".join(a["stages"]), f"{a['steps_flagged']}/{a['steps_total']}", f"{a['mean_ratio']:.2f}x",
                      _ms(a["excess_ms"]))
    return table


def render(summary: dict, console: Console) -> None:
    """Prints the summary: input, verdict, anomalies with evidence, slowest ranks, limits."""
    inp, verdict = summary["input"], summary["verdict"]
    topo = inp["topology"]
    layout = "-" if topo is None else (
        f"dp {topo['dp']} x pp {topo['pp']} x tp {topo['tp']}" + (f" x dsp {topo['dsp']}" if topo["dsp"] > 1 else "")
        + f" = {topo['world_size']}" + (f", vpp {topo['vpp']}" if topo["vpp"] > 1 else "")
        + (", ranks placed by their records" if topo["rank_order"] == "recorded" else "")
        + ("" if topo["declared"] else " (no layout given)"))
    head = Table.grid(padding=(0, 2))
    head.add_row("input", f"{inp['path']} ({inp['format']})")
    minmax = f", {inp['min_max_steps']} min/max" if inp["min_max_steps"] else ""
    head.add_row("steps", f"{inp['steps']} per-rank{minmax}")
    head.add_row("ranks", f"{inp['ranks']} recorded; layout {layout}")
    if inp["median_step_ms"] is not None:
        head.add_row("step time", f"{_ms(inp['median_step_ms'])} ms (median)")
    problems = inp["problems"]
    if problems["total"]:
        head.add_row("problems", f"[yellow]{problems_line(problems)}[/]")
    console.print(Panel(head, title="relax-straggler analyze", expand=True))
    console.print(f"[{STATUS_STYLE[verdict['status']]}]{verdict['status'].upper()}[/]: {verdict['summary']}")
    confirmed = summary.get("confirmed")
    if confirmed is not None:
        console.print(f"confirmed verdict (the live decision over the steps): {_confirmed_line(confirmed, inp['steps'])}",
                      highlight=False)
    whatif = summary.get("whatif")
    if whatif is not None:
        console.print(f"what-if: {whatif['summary']} (M_S {whatif['m_s'] * 100:.0f} %, simulation error "
                      f"{whatif['simulation_error']:.3f})" if "error" not in whatif
                      else f"[dim]what-if: not replayed: {whatif['error']}[/]", highlight=False)

    if summary["anomalies"]:
        console.print(_anomaly_table("Anomalies", summary["anomalies"]))
        for a in summary["anomalies"]:
            console.print(f"[bold]{a['kind']}[/] {format_ranks(a['ranks'])}: {a['cause']}")
            for line in a["evidence"]:
                console.print(f"  - {line}")
    if summary["transient"]:
        console.print(f"{len(summary['transient'])} transient finding(s) (fewer steps than the persistence "
                      "threshold) are listed in the JSON output.")
    pipe = summary["pipeline"]
    if pipe["jumps"] or pipe["baseline_outliers"]:
        console.print(f"pipeline p2p: {pipe['jumps']} jump(s), {len(pipe['baseline_outliers'])} baseline outlier(s)")

    ranked = sorted(summary["per_rank"], key=lambda r: r["score"])[:TOP_RANKS]
    if ranked:
        table = Table(title=f"Slowest ranks (of {inp['ranks']})", title_justify="left")
        # Means over every step, healthy ones included: not a finding's ratio (docs/METRICS.md).
        for col in ("rank", "dp", "pp", "tp", "node", "score", "mean compute", "worst stage (mean)"):
            table.add_column(col, justify="left" if col.startswith("worst stage") else "right")
        for r in ranked:
            worst = max(r["slowdown"].items(), key=lambda kv: kv[1], default=None)
            table.add_row(str(r["rank"]), str(r["dp_rank"]), str(r["pp_rank"]), str(r["tp_rank"]),
                          "-" if r["node"] is None else str(r["node"]), f"{r['score']:.2f}",
                          f"{r['compute_slowdown']:.2f}x", "-" if worst is None else f"{worst[0]} {worst[1]:.2f}x")
        console.print(table)

    if summary["min_max"]:
        table = Table(title="Min/max timers: spread between the fastest and slowest rank", title_justify="left")
        for col in ("stage", "mean max ms", "widest max/min", "at step", "mean gap ms"):
            table.add_column(col, justify="left" if col == "stage" else "right")
        for s in summary["min_max"]["stages"]:
            wide = s.get("widest_max_over_min")
            table.add_row(s["stage"] + (" [yellow](spread)[/]" if s.get("spread") else ""), _ms(s["mean_max_ms"]),
                          "-" if wide is None else f"{wide:.2f}x", str(s.get("widest_step", "-")),
                          _ms(s.get("mean_gap_ms")))
        console.print(table)
    for line in summary["limitations"]:
        console.print(f"[dim]note: {line}[/]")
    for line in problems["first"][:5]:
        console.print(f"[yellow]problem:[/] {line}")


def _confirmed_line(confirmed: dict, steps: int) -> str:
    found = confirmed["stragglers"]
    if not found:
        imbalance = "".join(f"; imbalance in {i['stage']}: pipeline stage {i['group']} {i['ratio']:.2f}x the fastest "
                            f"from step {i['since_step']} (named in {i['steps']} steps)"
                            for i in confirmed.get("imbalance", [])[:1])
        return f"no straggler confirmed in {steps} steps (final state: {confirmed['final_status']}){imbalance}"
    top = found[0]
    more = f"; {len(found) - 1} more (rank, stage) pairs in the JSON" if len(found) > 1 else ""
    released = "" if top["to_end"] else f", released after step {top['last_step']}"
    return (f"straggler rank {top['rank']} in {top['stage']} from step {top['since_step']} (named in {top['steps']} "
            f"steps, {top['ratio']:.2f}x its group; cause: {top['cause']}){released}{more}")
