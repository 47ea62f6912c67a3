"""The monitor's HTTP API (FastAPI; the schema at /openapi.json, pages at /docs).

    GET    /                      health: version, store status, jobs, check interval
    GET    /jobs                  registered jobs with their status
    POST   /jobs/{job_id}         register (201; 200 when registered already); optional JSON
                                  body {"dp", "pp", "tp", "ranks_per_node"} (dp required in it)
    DELETE /jobs/{job_id}         unregister (404 when unknown)
    GET    /jobs/{job_id}         the job's status (as GET /{job_id})
    GET    /jobs/{job_id}/results every kept analysis, oldest first
    GET    /detect/{job_id}       register (the mt-detector form)
    GET    /undetect/{job_id}     unregister (the mt-detector form)
    GET    /metrics               Prometheus text format (relax_straggler/monitor/metrics.py)
    GET    /{job_id}              the job's status: job_id, status, hang_check, slowdown_check
                                  (straggler_prediction {straggler_rank, straggler_node}),
                                  metrics, iteration_count, last_iteration, evidence

Errors are JSON {"detail": message}: 404 unknown job, 422 a job id outside JOB_ID_PATTERN
or a malformed body (the message names the field; dp is required in a non-empty body), 400 a
layout the engine rejects or one of more than MAX_RANKS ranks.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Optional

from fastapi import FastAPI, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from relax_straggler.monitor.service import Monitor
from relax_straggler.stores.base import JOB_ID_PATTERN
from relax_straggler.monitor.range_analysis import MAX_RANKS
from relax_straggler.topology import Topology

# Job ids as store_base.JOB_ID_PATTERN; "jobs" and "metrics" are routes of their own and
# cannot be read through GET /{job_id}.
JobId = Path(pattern=JOB_ID_PATTERN, description="job id: letters, digits and . _ : @ + -, at most 128")


class TopologyBody(BaseModel):
    """The job's parallel layout: no body (or {}) = flat data parallel; otherwise dp is required
    and dp x pp x tp at most MAX_RANKS."""

    model_config = ConfigDict(extra="forbid")
    dp: int = Field(1, ge=1, description="data-parallel size (required in a non-empty body)")
    pp: int = Field(1, ge=1, description="pipeline-parallel size")
    tp: int = Field(1, ge=1, description="tensor-parallel size")
    ranks_per_node: Optional[int] = Field(None, ge=1, description="ranks per node (rank // it = node)")


def create_app(monitor: Monitor, run_monitor: bool = True) -> FastAPI:
    """The app over `monitor`. run_monitor: start the monitor's poll loop with the app and
    stop it (saving the state) when the app stops."""
    from relax_straggler import __version__

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if run_monitor:
            monitor.start()
        try:
            yield
        finally:
            if run_monitor:
                monitor.stop()

    app = FastAPI(title="relax-straggler monitor", version=__version__, lifespan=lifespan,
                  description="Online straggler detection over a metrics store. See docs/MONITOR.md.")

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            where = ".".join(str(x) for x in e.get("loc", ()))
            parts.append(f"{where}: {e.get('msg')}")
        return JSONResponse(status_code=422, content={"detail": "; ".join(parts) or "invalid request"})

    def unknown(job_id: str) -> HTTPException:
        return HTTPException(404, f"job {job_id!r} is not registered; register it with POST /jobs/{job_id} "
                                  f"or GET /detect/{job_id}")

    def view(job_id: str) -> dict:
        try:
            return monitor.view(job_id)
        except KeyError:
            raise unknown(job_id) from None

    def register(job_id: str, body: Optional[TopologyBody]) -> tuple[dict, bool]:
        topology = None
        if body is not None and body.model_fields_set:  # {} is no layout, like no body
            if "dp" not in body.model_fields_set:  # a default dp of 1 would make every other rank "outside"
                raise HTTPException(422, "body.dp: required with pp, tp or ranks_per_node (send no body for a "
                                         "flat data-parallel job)")
            try:
                topology = Topology(dp=body.dp, pp=body.pp, tp=body.tp, ranks_per_node=body.ranks_per_node)
            except ValueError as exc:
                raise HTTPException(400, f"topology: {exc}") from None
            if topology.world_size > MAX_RANKS:
                raise HTTPException(400, f"topology: dp x pp x tp = {topology.world_size:,} ranks, more than the "
                                         f"{MAX_RANKS:,} the monitor analyses")
        return monitor.register(job_id, topology)

    def unregister(job_id: str) -> dict:
        try:
            return monitor.unregister(job_id)
        except KeyError:
            raise unknown(job_id) from None

    @app.get("/", summary="Health, version and store status")
    def health() -> dict:
        store = monitor.health()
        return {"status": "ok" if store["ok"] else "degraded", "version": __version__, "store": store,
                "jobs": len(monitor.job_ids()), "check_interval_s": monitor.config.check_interval_s,
                "docs": "/docs", "openapi": "/openapi.json"}

    @app.get("/jobs", summary="Registered jobs and their status")
    def jobs() -> dict:
        return {"jobs": [{"job_id": j["job_id"], "status": j["status"], "iteration_count": j["iteration_count"],
                          "slow_iterations": j["slow_iterations"], "stragglers": j["stragglers"]}
                         for j in sorted(monitor.job_numbers(), key=lambda j: j["job_id"])]}

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(monitor.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/jobs/{job_id}", summary="Register a job", status_code=201)
    def post_job(response: Response, job_id: str = JobId, body: Optional[TopologyBody] = None) -> dict:
        state, created = register(job_id, body)
        if not created:
            response.status_code = 200
        return state

    @app.delete("/jobs/{job_id}", summary="Unregister a job")
    def delete_job(job_id: str = JobId) -> dict:
        return {"job_id": job_id, "unregistered": True, "last_status": unregister(job_id)["status"]}

    @app.get("/jobs/{job_id}", summary="A job's status")
    def get_job(job_id: str = JobId) -> dict:
        return view(job_id)

    @app.get("/jobs/{job_id}/results", summary="Every kept analysis of a job, oldest first")
    def get_results(job_id: str = JobId) -> dict:
        try:
            return {"job_id": job_id, "results": monitor.results(job_id)}
        except KeyError:
            raise unknown(job_id) from None

    @app.get("/detect/{job_id}", summary="Register a job (the mt-detector form)")
    def detect(job_id: str = JobId) -> dict:
        state, created = register(job_id, None)
        return {"job_id": job_id, "registered": True, "created": created, "status": state["status"],
                "message": f"job {job_id} is monitored" if created else f"job {job_id} was monitored already"}

    @app.get("/undetect/{job_id}", summary="Unregister a job (the mt-detector form)")
    def undetect(job_id: str = JobId) -> dict:
        last = unregister(job_id)
        return {"job_id": job_id, "registered": False, "last_status": last["status"],
                "message": f"job {job_id} is no longer monitored"}

    @app.get("/{job_id}", summary="A job's status (the mt-detector form)")
    def job_status(job_id: str = JobId) -> dict:
        return view(job_id)

    return app
