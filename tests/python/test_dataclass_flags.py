"""argparse flags derived from dataclass fields: names, dests, types, defaults, help, round trip."""

import argparse
from dataclasses import dataclass, field
from typing import Optional

import pytest

from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.common.dataclass_flags import add_field_flags, config_from_args, flag_field


@dataclass(frozen=True)
class Knobs:
    size: int = flag_field(4, "slots")
    path: Optional[str] = flag_field(None, "a file", name="out")
    on: bool = flag_field(False, "switch it on", dest="switch", action="store_true")


def test_names_dests_types_and_defaults_come_from_the_fields():
    parser = argparse.ArgumentParser()
    add_field_flags(parser, Knobs, prefix="--k-", dest_prefix="k_")
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}
    assert set(by_flag) == {"--k-size", "--k-out", "--k-on"}
    assert (by_flag["--k-size"].dest, by_flag["--k-size"].type, by_flag["--k-size"].default) == ("k_size", int, 4)
    assert (by_flag["--k-out"].dest, by_flag["--k-out"].type) == ("k_path", str)  # Optional[str] -> str
    assert by_flag["--k-on"].dest == "switch"
    args = parser.parse_args(["--k-size", "9", "--k-out", "x", "--k-on"])
    assert config_from_args(Knobs, args, dest_prefix="k_") == Knobs(size=9, path="x", on=True)
    assert config_from_args(Knobs, parser.parse_args([]), dest_prefix="k_") == Knobs()


def test_a_field_without_a_flag_is_refused():
    @dataclass
    class Half:
        a: int = flag_field(1, "has one")
        b: int = field(default=2)

    with pytest.raises(TypeError, match=r"Half\.b"):
        add_field_flags(argparse.ArgumentParser(), Half)


def test_show_default_and_metavar():
    parser = argparse.ArgumentParser()
    add_field_flags(parser, Knobs, metavar="N", show_default=True)
    size = next(a for a in parser._actions if a.dest == "size")
    assert (size.metavar, size.help) == ("N", "slots (default 4)")


def test_analyze_thresholds_round_trip():
    from relax_straggler.cli import analyze

    sub = argparse.ArgumentParser().add_subparsers()
    analyze.register(sub)
    parser = sub.choices["analyze"]
    assert config_from_args(AnalyzeConfig, parser.parse_args(["x"])) == AnalyzeConfig()
    args = parser.parse_args(["x", "--min-impact", "0.1", "--slow-step-window", "7", "--ensemble-steps", "30"])
    assert config_from_args(AnalyzeConfig, args) == AnalyzeConfig(min_impact=0.1, slow_step_window=7,
                                                                   ensemble_steps=30)
