"""Every null object stands in for its real counterpart: both implement one interface
(a Protocol), the interface names every public method and property of the real one, and
the null one has each with the same parameters (names, kinds, defaults), so code written
against the real one runs with the analysis off."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from relax_straggler.live.analyzer import Analyzer, AnalyzerAPI, NullAnalyzer
from relax_straggler.integrations.megatron import (MegatronAnalysis, MegatronAnalysisAPI, MegatronTimerAPI,
                                                   NullMegatronAnalysis, _NullTimer, _StageView)
from relax_straggler.live.op_records import NullOpRecorder, OpRecorder, OpRecorderAPI

# (interface, the real one, the null one). A _StageView hands what it does not time to the
# timer it chains to, so its members are read on an instance (chained to none).
PAIRS = [
    (AnalyzerAPI, Analyzer, NullAnalyzer),
    (OpRecorderAPI, OpRecorder, NullOpRecorder),
    (MegatronTimerAPI, _StageView(timer=None, sid=0, inner=None), _NullTimer),
    (MegatronAnalysisAPI, MegatronAnalysis, NullMegatronAnalysis),
]
IDS = ["analyzer", "op recorder", "megatron timer", "megatron analysis"]


def public(obj: Any) -> set[str]:
    """The public names of a class (or an instance's class), annotated data members included."""
    cls = obj if isinstance(obj, type) else type(obj)
    return {n for n in dir(cls) if not n.startswith("_")} | {
        n for c in cls.__mro__ for n in getattr(c, "__annotations__", {}) if not n.startswith("_")}


def shape(obj: Any, name: str) -> Any:
    """("method", [(name, kind, default) per parameter but self]) or "value" (a property,
    an attribute or a data member assigned in __init__); None when obj lacks `name`."""
    try:
        member = getattr(obj, name)
    except AttributeError:
        cls = obj if isinstance(obj, type) else type(obj)
        declared = cls._is_protocol and name in cls.__annotations__ if hasattr(cls, "_is_protocol") else False
        return "value" if declared or f"self.{name} = " in inspect.getsource(cls) else None
    if not (inspect.isfunction(member) or inspect.ismethod(member)):
        return "value"
    params = list(inspect.signature(member).parameters.values())
    if inspect.isfunction(member):  # read on the class: drop self
        params = params[1:]
    return "method", [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize("api, real, null", PAIRS, ids=IDS)
def test_the_interface_names_every_public_member_of_the_real_one(api, real, null):
    assert public(real) <= public(api), f"{api.__name__} lacks {sorted(public(real) - public(api))}"


@pytest.mark.parametrize("api, real, null", PAIRS, ids=IDS)
def test_the_real_and_the_null_one_implement_the_interface_alike(api, real, null):
    for name in sorted(public(api)):
        wanted = shape(api, name)
        assert shape(real, name) == wanted, f"{name}: {shape(real, name)} where {api.__name__} has {wanted}"
        assert shape(null, name) == wanted, f"{name}: {shape(null, name)} where {api.__name__} has {wanted}"
    for cls in (real, null):
        if isinstance(cls, type):  # a subclass of the interface: no member left to its stub
            assert api in cls.__mro__ and not cls.__abstractmethods__, cls


def test_the_disabled_analyzer_answers_as_one_that_measured_nothing():
    off = NullAnalyzer()
    assert (off.counters(), off.timer, off.stopped_by, off.inside(), off.summary()) == ({}, None, None, None, None)
    timers = object()
    assert NullMegatronAnalysis().adapter_for(timers) is timers
