"""The A/B loss-parity harness (docs/ARCHITECTURE.md invariant 6): it passes on the demo under DDP, and it
catches the smallest change an analyzer could make (one ulp of one parameter) and a
baseline that is not deterministic."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import REAL_RUNS, REPO
from workers.step_times import assert_not_blocked

from relax_straggler.cli import main as cli_main
from relax_straggler.demo import parity

TINY_DEMO = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "16", "--batch-size", "2"]


@REAL_RUNS
def test_demo_is_bitwise_identical_on_two_ranks(tmp_path):
    out = tmp_path / "parity.json"
    cmd = [sys.executable, "-m", "relax_straggler.cli.parity", "--nproc", "2", "--steps", "12", "--intervals", "1",
           "10", *TINY_DEMO, "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          check=False, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS" in proc.stdout
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["deterministic"] and result["passed"]
    on1, on10 = result["runs"]
    # The analyzer really measured: every step at interval 1, steps 0 and 10 at interval 10,
    # on both ranks; the metrics rank got one report per sampled step.
    assert (on1["sampled_steps"], on1["reports"]) == (2 * 12, 12)
    assert (on10["sampled_steps"], on10["reports"]) == (2 * 2, 2)
    for run in (result["control"], on1, on10):
        assert run["loss_mismatches"] == 0 and run["tensor_mismatches"] == []
        assert run["tensors_compared"] > 2 * 20  # parameters and AdamW moments of both ranks
    for run in (on1, on10):
        assert_not_blocked(dict(enumerate(run["step_s"])), warmup=1, expected_steps=12)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(idx))


def tiny_factory(perturb_at: int = -1, ulps: int = 1):
    """A tiny training. With perturb_at >= 0, a run with the analyzer enabled moves one
    weight by `ulps` units in the last place after that step."""

    def factory(seed: int) -> parity.ParityTraining:
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(seed)

        def step(analyzer, i: int) -> torch.Tensor:
            with analyzer.section("data"):
                x = torch.randint(0, 16, (4, 8), generator=gen)
            loss = F.cross_entropy(model(x).view(-1, 16), x.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if analyzer.enabled and i == perturb_at:
                with torch.no_grad():
                    w = model.head.weight
                    for _ in range(ulps):
                        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
            return loss.detach()

        return parity.ParityTraining(model, opt, step)

    return factory


def test_tiny_training_passes():
    result = parity.run_parity(tiny_factory(), steps=6, intervals=(1, 3))
    assert result.passed and result.exit_code == parity.EXIT_IDENTICAL
    assert [r.sampled_steps for r in result.runs] == [6, 2]


def test_a_changed_weight_fails_from_the_next_step():
    result = parity.run_parity(tiny_factory(perturb_at=2, ulps=1000), steps=6, intervals=(1,))
    (run,) = result.runs
    assert result.deterministic and not result.passed and result.exit_code == parity.EXIT_DIFFERENT
    assert run.first_mismatch_step == 3 and run.loss_mismatches == 3
    assert "rank 0: model.head.weight" in run.tensor_mismatches
    assert 0 < run.max_loss_abs_diff < 1e-4


def test_one_ulp_in_the_final_state_alone_fails():
    result = parity.run_parity(tiny_factory(perturb_at=5), steps=6, intervals=(1,))
    (run,) = result.runs
    assert run.loss_mismatches == 0 and run.first_mismatch_step is None
    assert run.tensor_mismatches == ("rank 0: model.head.weight",)
    assert result.exit_code == parity.EXIT_DIFFERENT


def test_control_run_exposes_a_nondeterministic_baseline():
    calls = []

    def drifting(seed: int) -> parity.ParityTraining:
        calls.append(seed)
        return tiny_factory()(seed + len(calls))  # every build sees other data: not reproducible

    result = parity.run_parity(drifting, steps=3, intervals=(1,))
    assert not result.deterministic and result.exit_code == parity.EXIT_NONDETERMINISTIC


def test_bitwise_comparison():
    z, nz = torch.tensor(0.0), torch.tensor(-0.0)
    assert torch.equal(z, nz) and not parity.same_bits(z, nz)
    nan = torch.tensor(float("nan"))
    assert parity.same_bits(nan, nan.clone())
    assert not parity.same_bits(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not parity.same_bits(torch.zeros(2), torch.zeros(1, 2))


def test_bad_arguments_and_bad_factories():
    with pytest.raises(ValueError, match="steps"):
        parity.run_parity(tiny_factory(), steps=0)
    with pytest.raises(ValueError, match="intervals"):
        parity.run_parity(tiny_factory(), intervals=(0,))
    with pytest.raises(TypeError, match="ParityTraining"):
        parity.run_parity(lambda seed: (None, None, None), steps=1)


USER_SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from relax_straggler.demo.parity import ParityTraining

    def {name}(seed):
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        gen = torch.Generator().manual_seed(seed)

        def step(analyzer, i):
            with analyzer.section("data"):
                x = torch.randn(8, 4, generator=gen)
            loss = F.mse_loss(model(x), x.flip(1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            {extra}
            return loss.detach()

        return ParityTraining(model, opt, step)

    if __name__ == "__main__":
        raise SystemExit("imported, never run as a script")
""")


def test_user_script_through_the_command(tmp_path, capsys):
    good = tmp_path / "good.py"
    good.write_text(USER_SCRIPT.format(name="parity_training", extra="pass"))
    assert cli_main(["parity", "--script", str(good), "--steps", "4", "--intervals", "1", "2"]) == 0
    assert "PASS" in capsys.readouterr().out

    named = tmp_path / "named.py"
    extra = "if analyzer.enabled and i == 1: torch.nn.init.zeros_(model.bias)"
    named.write_text(USER_SCRIPT.format(name="make", extra=extra))
    assert cli_main(["parity", "--script", f"{named}:make", "--steps", "4", "--intervals", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out

    with pytest.raises(AttributeError, match="parity_training"):
        parity.load_factory(str(named))
    with pytest.raises(FileNotFoundError):
        parity.load_factory(str(tmp_path / "missing.py"))
