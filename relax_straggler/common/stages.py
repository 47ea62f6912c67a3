"""The closed set of stage names (docs/ARCHITECTURE.md, data contract).

Every rank reports every stage in this order, so the per-rank payload has a fixed
shape; a stage a rank did not run is NaN. Communication stages (``communication`` and
``communication/<op>``) are judged by the late-arrival rule (docs/ARCHITECTURE.md invariant 7).
Measured stages are no section: ``untimed`` is the step's host wall time outside every
timed section and collective (the rank's own code between them), which the stage timer
measures on sampled steps; it is judged like a compute stage.
"""

from __future__ import annotations

CORE_STAGES = ("forward", "backward", "optimizer", "communication", "data")
MODULE_STAGES = ("attention", "moe")
COMMUNICATION_OPS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall", "send", "recv")

MEASURED_STAGES = ("untimed",)

STAGES: tuple[str, ...] = (CORE_STAGES + MODULE_STAGES + tuple(f"communication/{op}" for op in COMMUNICATION_OPS)
                           + MEASURED_STAGES)
STAGE_IDS: dict[str, int] = {name: i for i, name in enumerate(STAGES)}

# Stages whose time scales with the work a rank does; compared per token when ranks
# report their workload (set_workload). Communication and the optimizer do not scale.
WORKLOAD_STAGES = frozenset({"forward", "backward", "attention", "moe"})


def stage_id(name: str) -> int:
    """Column of `name` in the payload. Raises ValueError for a name outside STAGES."""
    try:
        return STAGE_IDS[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages are: {', '.join(STAGES)}") from None


def check_section(name: str) -> None:
    """Raises ValueError unless `name` is a stage a section may time (not a measured one)."""
    stage_id(name)
    if name in MEASURED_STAGES:
        raise ValueError(f"stage {name!r} is measured by the analyzer, not timed by a section; sections time: "
                         f"{', '.join(s for s in STAGES if s not in MEASURED_STAGES)}")


def is_communication(name: str) -> bool:
    return name == "communication" or name.startswith("communication/")
