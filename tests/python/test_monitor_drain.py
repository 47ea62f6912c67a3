"""The drain plan (relax_straggler/monitor/drain.py): proposed for a confirmed straggler or a
hang's culprit, nodes only from the rows' node column or the job's ranks_per_node, every
name shell-quoted, never run; served in GET /{job_id} and printed by `relax-straggler
drain-plan` from a monitor or a store."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from relax_straggler.monitor.drain import drain_plan, plan_text
from relax_straggler.monitor.verdict import current_verdict

sys.path.insert(0, str(Path(__file__).parent))
from test_monitor_api import CLI, REPO, servers  # noqa: E402,F401 (servers: the fixture)
from test_monitor_page import straggler_monitor  # noqa: E402,F401 (the fixture)

RESULT = {"straggler_rank": 5, "straggler_node": "node-1", "stage": "forward", "cause": "a sentence",
          "mean_ratio": 1.8, "excess_ms": 80.0, "window": {"first_iteration": 40, "last_iteration": 44},
          "confirmed": {"stragglers": [{"rank": 5, "stage": "forward", "since_step": 42, "cause": "compute",
                                        "ratio": 1.7}]},
          "live_verdict": None}


def test_a_confirmed_straggler_gets_a_plan_a_suspected_one_none():
    verdict = current_verdict("train-1", "detected", RESULT, None)
    assert (verdict["rank"], verdict["node"], verdict["node_source"], verdict["cause"], verdict["status"],
            verdict["since_step"]) == (5, "node-1", "store", "compute", "confirmed", 42)
    plan = drain_plan(verdict, 0.8, 100.0, 180.0, RESULT)
    assert plan["executed"] is False and plan["ranks"] == [5] and plan["nodes"] == ["node-1"]
    assert plan["evidence"]["since_step"] == 42 and plan["give_back"]["excess_ms_per_step"] == 80.0
    slurm, = plan["commands"]["slurm"]
    assert shlex.split(slurm)[:4] == ["scontrol", "update", "NodeName=node-1", "State=DRAIN"]
    assert shlex.split(slurm)[4].startswith("Reason=relax-straggler: job train-1 rank 5 straggler in forward")
    assert plan["commands"]["kubernetes"] == ["kubectl cordon node-1",
                                              "kubectl taint nodes node-1 relax-straggler/straggler=train-1:NoSchedule"]
    suspected = current_verdict("train-1", "detected", {**RESULT, "confirmed": None}, None)
    assert suspected["status"] == "suspected" and suspected["cause"] == "unknown"
    assert drain_plan(suspected, 0.8, 100.0, 180.0, RESULT) is None
    assert current_verdict("train-1", "finished", RESULT, None) is None  # over: nothing to drain or page


def test_nodes_come_from_the_rows_or_the_jobs_layout_and_are_quoted():
    unnamed = {**RESULT, "straggler_node": None}
    assert drain_plan(current_verdict("j", "detected", unnamed, None), None, None, None, unnamed)["commands"] is None
    by_layout = current_verdict("j", "detected", unnamed, None, node_of_rank=1)
    assert (by_layout["node"], by_layout["node_source"]) == ("node-1", "ranks_per_node")
    hostile = {**RESULT, "straggler_node": "gpu-7; rm -rf /"}
    plan = drain_plan(current_verdict("j:1@x", "detected", hostile, None), None, None, None, hostile)
    assert shlex.split(plan["commands"]["kubernetes"][0]) == ["kubectl", "cordon", "gpu-7; rm -rf /"]
    assert plan["commands"]["kubernetes"][1].endswith("relax-straggler/straggler=j_1_x:NoSchedule")


def test_a_hangs_culprit_gets_a_plan():
    answer = {"rank": 3, "kind": "lagging", "step": 17, "node": "node-0", "answer": "rank 3 never arrived"}
    verdict = current_verdict("stuck", "hanging", None, answer)
    assert (verdict["rank"], verdict["node"], verdict["status"], verdict["cause"]) == \
        (3, "node-0", "hanging", "lagging")
    plan = drain_plan(verdict, None, None, None, None)
    assert plan["nodes"] == ["node-0"] and "hang culprit since step 17" in plan["reason"]
    assert "kubectl cordon node-0" in plan_text("stuck", "hanging", plan)
    assert current_verdict("stuck", "hanging", None, {"rank": -1, "kind": "desync", "step": 17}) is None


def test_get_job_and_the_cli_give_the_plan_of_the_store_node(straggler_monitor, file_url):
    view = straggler_monitor.client.get("/train-1").json()
    # The store's node column: rank 5 is on node-1 (4 ranks per node).
    assert view["drain_plan"]["nodes"] == ["node-1"] and view["drain_plan"]["ranks"] == [5]
    assert view["drain_plan"]["executed"] is False
    url = f"http://127.0.0.1:{straggler_monitor.port}"
    out = subprocess.run(CLI + ["drain-plan", url, "--job", "train-1", "--format", "json"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["drain_plan"] == view["drain_plan"]
    printed = subprocess.run(CLI + ["drain-plan", file_url, "--job", "train-1"], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert "scontrol update NodeName=node-1 State=DRAIN" in printed.stdout and "kubectl cordon node-1" in printed.stdout
    missing = subprocess.run(CLI + ["drain-plan", url, "--job", "nope"], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 1 and "'nope' is not registered" in missing.stderr
