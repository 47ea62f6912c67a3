"""The monitor's HTTP API (FastAPI; the schema at /openapi.json, its reference at /docs).

    GET    /                      health: version, store status, jobs, jobs with problems, check
                                  interval ("degraded" while the store fails or a job has problems);
                                  with Accept: text/html (a browser), the status page (page.py;
                                  ?offset=N&limit=M pages its jobs as GET /jobs does)
    GET    /docs                  the API reference, a self-contained page (nothing from a CDN:
                                  it works on an air-gapped cluster; /redoc leads there)
    GET    /jobs                  registered jobs with their status, by job id, JOBS_PAGE at a time
                                  (?offset=N&limit=M, M at most MAX_JOBS_PAGE; next_offset: the
                                  next page's offset, null on the last)
    POST   /jobs/{job_id}         register (201; 200 when registered already); optional JSON
                                  body {"dp", "pp", "tp", "ranks_per_node"} (dp required in it)
    DELETE /jobs/{job_id}         unregister (404 when unknown)
    GET    /jobs/{job_id}         the job's status (as GET /{job_id})
    GET    /jobs/{job_id}/results every kept analysis, oldest first
    GET    /detect/{job_id}       register (the mt-detector form; only with allow_get_registration)
    GET    /undetect/{job_id}     unregister (the mt-detector form; likewise)
    GET    /metrics               Prometheus text format (relax_straggler/monitor/metrics.py; built
                                  once per change, not per scrape)
    GET    /{job_id}              the job's status: job_id, status, hang_check, slowdown_check
                                  (straggler_prediction {straggler_rank, straggler_node}),
                                  metrics, iteration_count, last_iteration, evidence, end,
                                  verdict (verdict.py), drain_plan (drain.py: proposed, never run)

Errors are JSON {"detail": message} (a string, for 422 as well): 400 a Host header that is
not allowed (guard.py), a body nested too deep to parse, a layout Topology rejects (one of
more than topology.MAX_WORLD_SIZE ranks among them);
401 a register / unregister without the token, when one is set; 403 GET /detect or
/undetect while they are off; 404 unknown job; 409 a registration beyond the monitor's
max_jobs; 413 a body over the guard's limit; 422 a job id outside JOB_ID_PATTERN or a
malformed body (the message names the field; dp is required in a non-empty body; sizes are
JSON integers, not true or "4"). Every route's OpenAPI entry lists the errors it can answer.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Annotated, Optional

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from relax_straggler.common.topology import Topology
from relax_straggler.monitor import page
from relax_straggler.monitor.guard import ApiGuard, GuardMiddleware
from relax_straggler.monitor.service import JobLimitError, Monitor
from relax_straggler.stores.base import JOB_ID_PATTERN

# Job ids as store_base.JOB_ID_PATTERN; "jobs", "metrics", "docs" and "redoc" are routes of
# their own and cannot be read through GET /{job_id} (GET /jobs/{job_id} reads any).
JobId = Path(pattern=JOB_ID_PATTERN, description="job id: letters, digits and . _ : @ + -, at most 128")

# GET /jobs pages: a page of 1,000 jobs is 80 KB of JSON.
JOBS_PAGE = 100
MAX_JOBS_PAGE = 1000

# Strict: JSON true or "4" is not a size (lax parsing made them 1 and 4).
Size = Annotated[int, Field(strict=True, ge=1)]


class TopologyBody(BaseModel):
    """The job's parallel layout: no body (or {}) = flat data parallel; otherwise dp is required
    and dp x pp x tp at most topology.MAX_WORLD_SIZE."""

    model_config = ConfigDict(extra="forbid")
    dp: Size = Field(1, description="data-parallel size (required in a non-empty body)")
    pp: Size = Field(1, description="pipeline-parallel size")
    tp: Size = Field(1, description="tensor-parallel size")
    ranks_per_node: Optional[Size] = Field(None, description="ranks per node (rank // it = node)")


class ErrorBody(BaseModel):
    """Every error answer."""

    detail: str = Field(description="what is wrong, naming the field or the job")


def _errors(*codes: int) -> dict:
    why = {400: "Host header not allowed, a body the JSON parser cannot take, or a layout the engine rejects",
           401: "token missing or wrong", 403: "this form is off on this monitor", 404: "job not registered",
           409: "the monitor's registration limit is reached", 413: "request body too large",
           422: "invalid job id or body"}
    return {c: {"model": ErrorBody, "description": why[c]} for c in codes}


# Every route: a bad Host (400), an oversized body (413, the guard reads every body).
_ANY = (400, 413)
_JOB = (*_ANY, 404, 422)


def create_app(monitor: Monitor, run_monitor: bool = True, guard: ApiGuard = ApiGuard()) -> FastAPI:
    """The app over `monitor`, its requests checked by `guard`. run_monitor: start the
    monitor's poll loop with the app and stop it (saving the state) when the app stops."""
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

    # FastAPI's /docs and /redoc load their scripts from a CDN: off, replaced by page.docs_page.
    app = FastAPI(title="relax-straggler monitor", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None, description="Online straggler detection over a metrics store. See docs/MONITOR.md.")
    app.add_middleware(GuardMiddleware, guard=guard)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            where = ".".join(str(x) for x in e.get("loc", ()))
            parts.append(f"{where}: {e.get('msg')}")
        return JSONResponse(status_code=422, content={"detail": "; ".join(parts) or "invalid request"})

    if guard.token is None:
        def authorized() -> None:
            return None
        mutating = (*_JOB,)
    else:
        bearer = HTTPBearer(auto_error=False, description="the monitor's token (--token-file or "
                                                          "RELAX_STRAGGLER_MONITOR_TOKEN)")

        def authorized(credentials: Optional[HTTPAuthorizationCredentials] = Security(bearer)) -> None:
            if credentials is None or not guard.token_ok(f"Bearer {credentials.credentials}"):
                raise HTTPException(401, "this call changes the monitor's state: send the token as "
                                         "'Authorization: Bearer TOKEN'", headers={"WWW-Authenticate": "Bearer"})
        mutating = (*_JOB, 401)

    def unknown(job_id: str) -> HTTPException:
        return HTTPException(404, f"job {job_id!r} is not registered; register it with POST /jobs/{job_id}")

    def view(job_id: str) -> JSONResponse:
        try:
            return JSONResponse(monitor.view(job_id))
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
            except ValueError as exc:  # a layout beyond MAX_WORLD_SIZE among them
                raise HTTPException(400, f"topology: {exc}") from None
        try:
            return monitor.register(job_id, topology)
        except JobLimitError as exc:
            raise HTTPException(409, str(exc)) from None

    def unregister(job_id: str) -> dict:
        try:
            return monitor.unregister(job_id)
        except KeyError:
            raise unknown(job_id) from None

    # The reads run on the event loop (async): they hold the monitor's lock for microseconds and
    # do no I/O, and under load the hop to a worker thread cost more than the read. Each answers
    # its JSON itself (view() and job_numbers() give JSON-safe values), without FastAPI's encoder.
    @app.get("/", summary="Health, version and store status (the status page for a browser)",
             responses={200: {"content": {"text/html": {"schema": {"type": "string"}}},
                              "description": "JSON, or the status page for Accept: text/html"}, **_errors(*_ANY, 422)})
    async def health(request: Request, offset: int = Query(0, ge=0, description="status page: jobs to skip"),
                     limit: int = Query(JOBS_PAGE, ge=1, le=MAX_JOBS_PAGE,
                                        description="status page: jobs shown")) -> dict:
        store = monitor.health()
        problems = monitor.job_problems()
        answer = {"status": "ok" if store["ok"] and not problems["count"] else "degraded",
                  "version": __version__, "store": store, "jobs": monitor.job_count(),
                  "job_problems": problems, "check_interval_s": monitor.config.check_interval_s,
                  "docs": "/docs", "openapi": "/openapi.json"}
        if not _wants_html(request.headers.get("accept", "")):
            return JSONResponse(answer)
        jobs = monitor.job_numbers(offset, limit)
        drawn = [j["job_id"] for j in jobs if j["verdict"] is not None][:page.MAX_PICTURES]
        return HTMLResponse(page.status_page(__version__, answer, jobs, monitor.job_count(), offset, limit,
                                             monitor.pictures(drawn)), headers={"Vary": "Accept"})

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page.docs_page(app.openapi()))

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> RedirectResponse:
        return RedirectResponse("/docs")

    @app.get("/jobs", summary="Registered jobs and their status, a page at a time, by job id",
             responses=_errors(*_ANY, 422))
    async def jobs(offset: int = Query(0, ge=0, description="jobs to skip"),
                   limit: int = Query(JOBS_PAGE, ge=1, le=MAX_JOBS_PAGE, description="jobs in this page")) -> dict:
        total = monitor.job_count()
        page = monitor.job_numbers(offset, limit)
        return JSONResponse({"jobs": [{"job_id": j["job_id"], "status": j["status"],
                                       "iteration_count": j["iteration_count"], "slow_iterations": j["slow_iterations"],
                                       "stragglers": j["stragglers"]} for j in page],
                             "total": total, "offset": offset, "limit": limit,
                             "next_offset": offset + limit if offset + limit < total else None})

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text format"}, **_errors(*_ANY)})
    def metrics(request: Request) -> Response:
        if _accepts_gzip(request.headers.get("accept-encoding", "")):
            return Response(monitor.metrics.text(gzipped=True), media_type=CONTENT_TYPE_LATEST,
                            headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
        return Response(monitor.metrics.text(), media_type=CONTENT_TYPE_LATEST, headers={"Vary": "Accept-Encoding"})

    @app.post("/jobs/{job_id}", summary="Register a job", status_code=201, dependencies=[Depends(authorized)],
              responses={200: {"description": "registered already (a body replaces the layout)",
                              "content": {"application/json": {"schema": {"type": "object"}}}},
                         **_errors(*mutating, 409)})
    def post_job(response: Response, job_id: str = JobId, body: Optional[TopologyBody] = None) -> dict:
        state, created = register(job_id, body)
        if not created:
            response.status_code = 200
        return state

    @app.delete("/jobs/{job_id}", summary="Unregister a job", dependencies=[Depends(authorized)],
                responses=_errors(*mutating))
    def delete_job(job_id: str = JobId) -> dict:
        return {"job_id": job_id, "unregistered": True, "last_status": unregister(job_id)["status"]}

    @app.get("/jobs/{job_id}", summary="A job's status", responses=_errors(*_JOB))
    async def get_job(job_id: str = JobId) -> dict:
        return view(job_id)

    @app.get("/jobs/{job_id}/results", summary="Every kept analysis of a job, oldest first",
             responses=_errors(*_JOB))
    async def get_results(job_id: str = JobId) -> dict:
        try:
            return JSONResponse({"job_id": job_id, "results": monitor.results(job_id)})
        except KeyError:
            raise unknown(job_id) from None

    if guard.allow_get_registration:
        @app.get("/detect/{job_id}", summary="Register a job (the mt-detector form)",
                 dependencies=[Depends(authorized)], responses=_errors(*mutating, 409))
        def detect(job_id: str = JobId) -> dict:
            state, created = register(job_id, None)
            return {"job_id": job_id, "registered": True, "created": created, "status": state["status"],
                    "message": f"job {job_id} is monitored" if created else f"job {job_id} was monitored already"}

        @app.get("/undetect/{job_id}", summary="Unregister a job (the mt-detector form)",
                 dependencies=[Depends(authorized)], responses=_errors(*mutating))
        def undetect(job_id: str = JobId) -> dict:
            last = unregister(job_id)
            return {"job_id": job_id, "registered": False, "last_status": last["status"],
                    "message": f"job {job_id} is no longer monitored"}
    else:
        # Off, these say so (rather than a bare 404) and stay out of the schema.
        @app.get("/detect/{job_id}", include_in_schema=False)
        @app.get("/undetect/{job_id}", include_in_schema=False)
        def get_registration_off(request: Request) -> None:
            raise HTTPException(403, f"GET {request.url.path.rsplit('/', 1)[0]}/{{job_id}} changes the monitor's "
                                     "state, which any web page could make a browser do, so it is off: use POST or "
                                     "DELETE /jobs/{job_id}, or start the monitor with --allow-get-registration")

    @app.get("/{job_id}", summary="A job's status (the mt-detector form)", responses=_errors(*_JOB))
    async def job_status(job_id: str = JobId) -> dict:
        return view(job_id)

    return app


def _wants_html(accept: str) -> bool:
    """Whether an Accept header value prefers HTML to JSON (a browser's: text/html named with
    q > 0, and application/json not named with a higher q). */* alone (curl) is JSON."""
    def q(media: str) -> float:
        for part in accept.split(","):
            kind, _, params = part.partition(";")
            if kind.strip().lower() == media:
                name, _, value = params.strip().partition("=")
                try:
                    return float(value) if name.strip().lower() == "q" else 1.0
                except ValueError:
                    return 0.0
        return 0.0
    html_q = q("text/html")
    return html_q > 0 and html_q >= q("application/json")


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header value takes gzip (RFC 9110 section 12.5.3: "gzip"
    or "*", not with q=0)."""
    for part in accept_encoding.split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            name, _, value = params.strip().partition("=")
            try:
                return name.strip().lower() != "q" or float(value) > 0
            except ValueError:
                return False
    return False
