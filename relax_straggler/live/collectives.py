"""The collective layer: every training process group's backend wrapped by TimedBackend.

install() wraps the backends of all existing process groups (the default group and
every `new_group`), then checks at each step boundary whether groups were created since
(Megatron creates many) and wraps those too. uninstall() puts every original backend
back. The side group of the analyzer itself is never wrapped.

How: c10d lets a ProcessGroup map a device type to a backend of a given type. The
wrapper is registered as the group's CUSTOM backend for the device, so the dispatcher
sends that device's collectives through it, while the group's default backend, name
and sequence numbers stay the original's. One wrapper per group: where a group has
different backends per device (cpu:gloo,cuda:nccl) only the CUDA one is timed.

Every wrapped backend also keeps the group's progress (the last collective and send/recv
entered, the last op seen completed; csrc/torch/group_progress.h): progress() reads it
from any thread, for the hang watchdog (relax_straggler.hang).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import torch
import torch.distributed as dist

from relax_straggler._ext import ext

log = logging.getLogger(__name__)

# CUDA first: where a group has two backends, the training collectives run on CUDA.
_DEVICE_ORDER = ("cuda", "cpu")


def group_registry() -> dict:
    """torch.distributed's registry of live process groups (the default group included)."""
    try:
        return dist.distributed_c10d._world.pg_map
    except AttributeError as exc:  # a torch whose private registry moved
        raise RuntimeError(f"cannot list process groups on torch {torch.__version__} "
                           "(torch.distributed.distributed_c10d._world.pg_map)") from exc


class CollectiveLayer:
    """Times the collectives of every process group except `exclude` into `timer`.

    analyzed_ranks: global ranks compared by the analyzer; a group spanning exactly those
    ranks gives per-collective durations comparable across ranks (late-arrival evidence).
    """

    def __init__(self, timer: Any, analyzed_ranks: Iterable[int], exclude: Iterable[dist.ProcessGroup]) -> None:
        self._timer = timer
        self._ranks = frozenset(analyzed_ranks)
        self._exclude = list(exclude)
        self._wrapped: dict[dist.ProcessGroup, list[str]] = {}
        # (name, description, ranks, GroupProgress) per wrapped group; replaced, never
        # mutated, so the watchdog thread reads it without a lock.
        self._progress: tuple[tuple[str, str, tuple[int, ...], Any], ...] = ()
        self._known = 0
        self.poll()

    @property
    def groups(self) -> dict[dist.ProcessGroup, list[str]]:
        """Wrapped groups and the device types wrapped on each."""
        return dict(self._wrapped)

    def poll(self) -> None:
        """Wraps groups created since the last call, forgets destroyed ones. One len() when
        the number of groups did not change (a group destroyed and another created between
        two polls is picked up at the next change)."""
        registry = group_registry()
        if len(registry) == self._known:
            return
        self._known = len(registry)
        self._wrapped = {pg: devices for pg, devices in self._wrapped.items() if pg in registry}
        for pg in list(registry):
            if pg in self._wrapped or any(pg is g for g in self._exclude):
                continue
            self._wrapped[pg] = self._wrap(pg)
        self._progress = tuple(_progress_handle(pg, devices) for pg, devices in self._wrapped.items() if devices)

    def progress(self) -> list[dict[str, Any]]:
        """The progress of every wrapped group, safe from any thread: per group {"name",
        "desc", "ranks" (global), "collective", "p2p", "completed"}, each of the last three
        None or {"seq", "op", "ago_s"} (seconds since entered / completed, at a clock
        resolution of a few ms). Sequence numbers count this rank's ops on the group since
        it was wrapped, collectives and send/recv separately."""
        now = ext().coarse_now_ns()
        out = []
        for name, desc, ranks, handle in self._progress:
            entry: dict[str, Any] = {"name": name, "desc": desc, "ranks": list(ranks)}
            for kind, e in handle.snapshot().items():
                entry[kind] = None if e is None else {"seq": e["seq"], "op": e["op"],
                                                      "ago_s": max(now - e["ns"], 0) / 1e9}
            out.append(entry)
        return out

    def _wrap(self, pg: dist.ProcessGroup) -> list[str]:
        """The device types of `pg` now timed; a group that cannot be wrapped (a backend or a
        torch the layer does not know) stays as it is, untimed, with one warning."""
        wrapped: list[str] = []
        try:
            comparable = frozenset(dist.get_process_group_ranks(pg)) == self._ranks
            devices = {d.type for d in pg._device_types}
            for d in _DEVICE_ORDER:
                if d in devices and ext().wrap_process_group(pg, d, self._timer, comparable):
                    wrapped.append(d)
        except Exception as exc:
            log.warning("relax_straggler: cannot time process group %s (%s); its collectives run untimed",
                        _group_name(pg), exc)
            return wrapped
        if not wrapped:
            log.info("relax_straggler: process group %s has no backend the collective layer can wrap", _group_name(pg))
        return wrapped

    def restore(self) -> None:
        """Puts every original backend back."""
        for pg, devices in self._wrapped.items():
            for device in devices:
                ext().unwrap_process_group(pg, device)
        self._wrapped.clear()
        self._progress = ()
        self._known = 0


def _group_name(pg: dist.ProcessGroup) -> str:
    try:
        return dist.distributed_c10d._get_process_group_name(pg)
    except Exception:  # a torch without the private helper
        return repr(pg)


def _progress_handle(pg: dist.ProcessGroup, devices: list[str]) -> tuple[str, str, tuple[int, ...], Any]:
    """(name, description, global ranks, GroupProgress) of a wrapped group; the timed device
    is the first wrapped one (CUDA where both are)."""
    name = _group_name(pg)
    desc = getattr(pg, "group_desc", "") or ""
    return name, desc, tuple(dist.get_process_group_ranks(pg)), ext().progress_of(pg, devices[0])
