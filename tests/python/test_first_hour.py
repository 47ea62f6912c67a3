"""What a new user sees: the start-up line, the verdict's changes and the summary on the
metrics rank by default (--straggler-quiet silences them), a warning for outputs configured
while the analysis is off, and install() / uninstall() not called on every rank named
within a bound instead of a hang."""

import json
import logging
import time

import pytest
import torch

import relax_straggler
from conftest import REAL_RUNS, REPO, torchrun
from relax_straggler import StragglerConfig
from relax_straggler.reporters import narrator
from workers.step_times import assert_not_blocked

WORKER = REPO / "tests" / "python" / "workers" / "first_hour.py"
JOIN_TIMEOUT_S = 3.0  # as in the worker


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train(model, opt, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def relax_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("relax_straggler")]


def test_start_up_line_and_summary_by_default(caplog):
    caplog.set_level(logging.INFO, logger="relax_straggler")
    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=True, interval=2, warmup_steps=2),
                                       report_fn=lambda m, s: None)
    train(model, opt, 10)
    analyzer.uninstall()
    lines = relax_lines(caplog)
    assert lines[0] == ("relax_straggler: analysing 1 rank (metrics rank 0): a report every 2 steps from step 2; "
                        "reports go to report_fn, the summary at uninstall()")
    assert lines[-1] == "relax_straggler: summary: no straggler confirmed in 4 reports"


def test_quiet_says_nothing(caplog):
    caplog.set_level(logging.INFO, logger="relax_straggler")
    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=True, quiet=True))
    train(model, opt, 12)
    analyzer.uninstall()
    assert relax_lines(caplog) == []


def test_a_process_without_logging_configured_sees_the_lines(monkeypatch, capsys):
    """No handler anywhere (Python would drop INFO records): one stderr handler is added."""
    logger = logging.getLogger("relax_straggler")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    narrator.show_by_default()
    assert [type(h) for h in logger.handlers] == [narrator._DefaultHandler]
    narrator.show_by_default()  # a second install adds no second handler
    assert len(logger.handlers) == 1
    logger.handlers[0].stream = __import__("sys").stderr  # capsys's stream
    logging.getLogger("relax_straggler.live.analyzer").info("relax_straggler: hello")
    assert capsys.readouterr().err == "relax_straggler: hello\n"


def test_a_configured_host_keeps_its_routing(monkeypatch):
    logger = logging.getLogger("relax_straggler")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "handlers", [logging.NullHandler()])
    narrator.show_by_default()
    assert logger.handlers == [] and logger.level == logging.NOTSET


@pytest.mark.parametrize("fields, named", [
    ({"jsonl_path": "x.jsonl", "console": True}, "--straggler-jsonl, --straggler-console"),
    ({"store_url": "file:///tmp/s"}, "--straggler-store"),
])
def test_outputs_while_the_analysis_is_off_are_named_once(caplog, fields, named):
    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(**fields))
    assert not analyzer.enabled
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(f"relax_straggler: {named} given but the analysis is off")
    assert "--straggler-analysis" in warned[0]


def test_report_fn_while_the_analysis_is_off_is_named(caplog):
    model, opt = make()
    relax_straggler.install(model, opt, config=StragglerConfig(), report_fn=lambda m, s: None)
    assert ["report_fn" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [True]


def test_off_without_outputs_is_silent(caplog):
    model, opt = make()
    relax_straggler.install(model, opt, config=StragglerConfig())
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_flags_without_analysis_warn_like_the_config(caplog):
    import argparse

    parser = argparse.ArgumentParser()
    relax_straggler.add_arguments(parser)
    config = relax_straggler.from_args(parser.parse_args(["--straggler-jsonl", "x.jsonl", "--straggler-console"]))
    model, opt = make()
    relax_straggler.install(model, opt, config=config)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_join_timeout_must_be_positive():
    with pytest.raises(ValueError, match="--straggler-join-timeout"):
        StragglerConfig(join_timeout_s=0)


# Real 2-rank Gloo runs ----------------------------------------------------------------

def run_worker(mode: str, tmp_path) -> tuple[str, list[dict]]:
    proc = torchrun(2, WORKER, [mode, str(tmp_path)], timeout_s=120)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    return proc.stdout + proc.stderr, ranks


@REAL_RUNS
def test_readme_snippet_says_it_runs_and_what_it_found(tmp_path):
    output, ranks = run_worker("readme", tmp_path)
    assert_not_blocked({r: got["step_s"] for r, got in enumerate(ranks)}, warmup=10, expected_steps=200)
    started = [line for line in output.splitlines() if "relax_straggler: analysing" in line]
    assert started == ["relax_straggler: analysing 2 ranks (metrics rank 0, over one flat group): a report every 10 "
                       "steps from step 10; "
                       "reports go to the summary at uninstall()"], output
    summaries = [line for line in output.splitlines() if line.startswith("relax_straggler: summary: ")]
    assert len(summaries) == 1, output  # the metrics rank only
    assert "in 19 reports" in summaries[0] or "confirmed" in summaries[0], summaries


@REAL_RUNS
def test_install_on_one_rank_raises_naming_it_within_the_bound(tmp_path):
    _, ranks = run_worker("install-one", tmp_path)
    assert_not_blocked({r: got["step_s"] for r, got in enumerate(ranks)}, warmup=2, expected_steps=20)
    error = ranks[0]["error"]
    assert error.startswith("JoinTimeout: relax_straggler.install() was called on 1 of 2 ranks within 3 s"), error
    assert "not on rank(s) 1" in error
    assert JOIN_TIMEOUT_S <= ranks[0]["install_s"] < JOIN_TIMEOUT_S + 5


@REAL_RUNS
def test_uninstall_on_one_rank_is_named_within_the_bound(tmp_path):
    _, ranks = run_worker("uninstall-one", tmp_path)
    assert_not_blocked({r: got["step_s"] for r, got in enumerate(ranks)}, warmup=2, expected_steps=20)
    alone, late = ranks
    assert alone["uninstall_s"] < 2 * JOIN_TIMEOUT_S + 1  # its bound (timeout_s), and a second of slack
    assert any(line.startswith("relax_straggler.uninstall() was called on 1 of 2 ranks") for line in alone["logged"]), \
        alone["logged"]
    assert any("rank 0 stopped waiting" in line for line in late["logged"]), late["logged"]
    assert late["uninstall_s"] < 2 * JOIN_TIMEOUT_S + 1


def fake_report(step: int, status: str, findings=()):
    """What the verdict lines read of a report: step, metrics, verdict.status and findings."""
    from types import SimpleNamespace

    found = [SimpleNamespace(state=state, rank=rank, group=0, stage=stage, describe=lambda t=text: t)
             for state, rank, stage, text in findings]
    return SimpleNamespace(step=step, metrics={}, verdict=SimpleNamespace(status=status, findings=found))


def test_the_verdict_changes_are_logged_once_each(caplog):
    caplog.set_level(logging.INFO, logger="relax_straggler")
    said = narrator.Narrator()
    slow = [("straggler", 1, "forward", "rank 1 straggler in forward since step 20")]
    for report in (fake_report(10, "healthy"), fake_report(20, "straggler", slow), fake_report(30, "straggler", slow),
                   fake_report(40, "healthy")):
        said.write(report)
    assert relax_lines(caplog) == ["relax_straggler: step 20: rank 1 straggler in forward since step 20",
                                   "relax_straggler: step 40: healthy: no rank is slow beyond its group's noise"]
    caplog.clear()
    quiet_console_on = narrator.Narrator(transitions=False)  # --straggler-console prints them instead
    quiet_console_on.write(fake_report(20, "straggler", slow))
    assert relax_lines(caplog) == []
