"""free_cores.py, the measure that decides whether make test's two streams run side by side."""

import os

import pytest

import free_cores


def test_a_cgroup_v2_quota_bounds_the_free_cores(tmp_path, monkeypatch):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 2000000\nuser_usec 1500000\n")
    monkeypatch.setattr(free_cores, "CGROUP", tmp_path)
    cores, used = free_cores.cpu_quota()
    assert cores == 1.5 and used() == 2.0
    assert free_cores.free_cores(0.05) <= 1.5  # the cgroup used nothing meanwhile: the quota bounds it


def test_a_cgroup_v1_quota_is_read_and_no_quota_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(free_cores, "CGROUP", tmp_path)
    assert free_cores.cpu_quota() is None  # neither file
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpuacct").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert free_cores.cpu_quota() is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpuacct" / "cpuacct.usage").write_text("3000000000\n")
    cores, used = free_cores.cpu_quota()
    assert cores == 0.5 and used() == 3.0
    (tmp_path / "cpu.max").write_text("max 100000\n")  # v2 without a quota comes first
    assert free_cores.cpu_quota() is None


def test_free_cores_is_within_the_affinity_and_main_rejects_a_bad_minimum(capsys):
    assert 0.0 <= free_cores.free_cores(0.05) <= len(os.sched_getaffinity(0)) + 1e-9
    for bad, says in (["two"], "invalid float value: 'two'"), (["nan"], "finite number >= 0, got nan"), \
                     (["-1"], "finite number >= 0, got -1.0"), (["1", "2"], "unrecognized arguments: 2"):
        with pytest.raises(SystemExit) as exit_:
            free_cores.main(bad)
        assert exit_.value.code == 2 and says in capsys.readouterr().err, bad
