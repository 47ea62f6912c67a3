"""StragglerConfig defaults, validation and the argparse round trip (RFC flags)."""

import argparse
import math

import pytest

from relax_straggler import StragglerConfig, add_arguments, from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_rfc_defaults():
    c = from_args(parse())
    assert c.enabled is False
    assert c.interval == 10
    assert c.relative_threshold == 1.2
    assert c.absolute_ms_threshold == 5.0
    assert c.ref == "mean"
    assert c.enable_module_stages is False
    assert c == StragglerConfig()


def test_round_trip_of_every_flag():
    c = from_args(parse("--straggler-analysis", "--straggler-interval", "3", "--straggler-relative-threshold", "1.5",
                        "--straggler-absolute-ms-threshold", "2.5", "--straggler-ref", "median",
                        "--straggler-enable-module-stages", "--straggler-warmup-steps", "0",
                        "--straggler-noise-floor-ms", "0", "--straggler-metrics-rank", "1",
                        "--straggler-jsonl", "x.jsonl", "--straggler-console", "--straggler-queue-size", "4",
                        "--straggler-max-events", "64", "--straggler-device-events", "cpu",
                        "--straggler-no-collective-timing", "--straggler-attention-pattern", "Attn$",
                        "--straggler-moe-pattern", "Experts$", "--straggler-window-every", "5",
                        "--straggler-window-size", "20", "--straggler-window-vote-rule", "most_votes",
                        "--straggler-window-min-votes", "4", "--straggler-window-min-slowdown", "0.05"))
    assert c == StragglerConfig(enabled=True, interval=3, relative_threshold=1.5, absolute_ms_threshold=2.5,
                                ref="median", enable_module_stages=True, warmup_steps=0, noise_floor_ms=0.0,
                                metrics_rank=1, jsonl_path="x.jsonl", console=True, queue_size=4, max_events=64,
                                device_events="cpu", collective_timing=False, attention_pattern="Attn$",
                                moe_pattern="Experts$", window_every=5, window_size=20,
                                window_vote_rule="most_votes", window_min_votes=4, window_min_slowdown=0.05)


def test_every_field_has_a_flag():
    flags = {a.dest for a in argparse.ArgumentParser()._actions}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = {a.dest for a in parser._actions} - flags
    fields = set(StragglerConfig.__dataclass_fields__)
    assert {d.removeprefix("straggler_") for d in dests} == (fields - {"enabled"}) | {"analysis"}


@pytest.mark.parametrize("argv, flag", [
    (("--straggler-interval", "0"), "--straggler-interval"),
    (("--straggler-interval", "-3"), "--straggler-interval"),
    (("--straggler-relative-threshold", "-1"), "--straggler-relative-threshold"),
    (("--straggler-relative-threshold", "nan"), "--straggler-relative-threshold"),
    (("--straggler-absolute-ms-threshold", "-0.5"), "--straggler-absolute-ms-threshold"),
    (("--straggler-absolute-ms-threshold", "nan"), "--straggler-absolute-ms-threshold"),
    (("--straggler-ref", "mode"), "--straggler-ref"),
    (("--straggler-noise-floor-ms", "inf"), "--straggler-noise-floor-ms"),
])
def test_bad_flags_raise_value_error_naming_the_flag(argv, flag):
    with pytest.raises(ValueError, match=flag):
        from_args(parse(*argv))


@pytest.mark.parametrize("field, value", [
    ("interval", 0), ("interval", 2.5), ("interval", True), ("relative_threshold", math.nan),
    ("relative_threshold", 0.9), ("absolute_ms_threshold", -1.0), ("ref", "p50"), ("warmup_steps", -1),
    ("metrics_rank", -1), ("queue_size", 0), ("max_events", 1), ("device_events", "tpu"),
    ("attention_pattern", "(unclosed"), ("moe_pattern", None), ("window_every", -1), ("window_size", 1),
    ("window_vote_rule", "all"), ("window_min_votes", 7), ("window_min_slowdown", math.inf),
])
def test_bad_fields_raise(field, value):
    with pytest.raises(ValueError, match="--straggler-" + field.replace("_", "-")):
        StragglerConfig(**{field: value})


def test_every_field_has_exactly_one_flag_and_no_flag_is_extra():
    parser = argparse.ArgumentParser()
    group = add_arguments(parser)
    actions = [a for a in group._group_actions]
    assert all(len(a.option_strings) == 1 and a.option_strings[0].startswith("--straggler-") for a in actions)
    dests = [a.dest for a in actions]
    assert len(dests) == len(set(dests)) == len(StragglerConfig.__dataclass_fields__)
    # Each dest is read back into its own field: flipping one flag's value changes exactly that field.
    base = StragglerConfig()
    for action in actions:
        args = parser.parse_args([])
        if action.const is not None:  # store_true / store_false
            setattr(args, action.dest, action.const)
        else:
            setattr(args, action.dest, "changed" if action.type is str else action.type(7))
        try:
            changed = from_args(args)
        except ValueError:  # "changed" is no valid ref / device-events / vote rule; the flag still reached its field
            continue
        assert sum(getattr(changed, f) != getattr(base, f) for f in StragglerConfig.__dataclass_fields__) == 1


def test_no_flags_give_the_dataclass_defaults():
    assert from_args(parse()) == StragglerConfig()
    assert from_args(parse()).collective_timing is True
    assert from_args(parse("--straggler-no-collective-timing")).collective_timing is False
