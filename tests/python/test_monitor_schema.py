"""The running monitor against its own OpenAPI schema (schemathesis): generated valid and
invalid requests to every operation answer no 5xx, only documented status codes and
content types, bodies matching the schema, and invalid input a 4xx. Then a table of
abusive requests the generator does not make (hosts, huge bodies, odd encodings)."""

from __future__ import annotations

import os
import signal
import socket

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402  (schemathesis brings hypothesis)
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,  # noqa: E402
                                               response_headers_conformance, response_schema_conformance,
                                               status_code_conformance)
from schemathesis.checks import not_a_server_error  # noqa: E402

from test_monitor_api import Server  # noqa: E402

TOKEN = "schema-test-token"
# Generated requests per mode and authorization (a longer run: RELAX_STRAGGLER_SCHEMA_EXAMPLES=N).
EXAMPLES = int(os.environ.get("RELAX_STRAGGLER_SCHEMA_EXAMPLES", "200"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture
def server(tmp_path, file_url):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    s = Server(file_url, tmp_path / "state.json", 30.0, "--token-file", str(token), "--allow-get-registration",
               "--max-jobs", "50")
    yield s
    s.stop(signal.SIGKILL)


def run_generated(schema, mode, checks, examples: int, headers: dict) -> int:
    """Runs up to `examples` generated requests; returns how many ran."""
    ran = [0]

    @given(case=schema.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def one(case) -> None:
        ran[0] += 1
        case.call_and_validate(headers=headers, checks=checks, timeout=30)

    one()
    return ran[0]


@pytest.mark.parametrize("authorized", [True, False], ids=["with-token", "without-token"])
def test_generated_requests_keep_the_schema(server, authorized):
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{server.port}/openapi.json")
    headers = {"Authorization": f"Bearer {TOKEN}"} if authorized else {}
    valid = run_generated(schema, schemathesis.GenerationMode.POSITIVE, CHECKS, EXAMPLES, headers)
    invalid = run_generated(schema, schemathesis.GenerationMode.NEGATIVE, [*CHECKS, negative_data_rejection],
                            EXAMPLES * 3 // 4, headers)
    print(f"schemathesis ({'with' if authorized else 'without'} token): {valid} valid, {invalid} invalid requests")
    assert server.client.get("/").json()["status"] == "ok"


def documented(schema: dict, method: str, route: str, status: int) -> bool:
    return str(status) in schema["paths"][route][method]["responses"]


ABUSE = [
    # method, path, extra request arguments, route whose schema applies, statuses allowed
    ("POST", "/jobs/" + "x" * 129, {}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/" + "a" + ":" * 127, {}, "/jobs/{job_id}", {201, 200}),
    ("GET", "/" + "z" * 5000, {}, "/{job_id}", {422}),
    ("POST", "/jobs/%00nul", {}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/%C3%BC", {}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/-leading", {}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"json": {"dp": True}}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"json": {"dp": "4"}}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"json": {"dp": 2.5}}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"json": {"dp": -1}}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"json": {"dp": 10 ** 400}}, "/jobs/{job_id}", {400, 422}),
    ("POST", "/jobs/ok", {"json": {"dp": 2, "pp": 2 ** 63, "tp": 2 ** 63}}, "/jobs/{job_id}", {400}),
    ("POST", "/jobs/ok", {"json": {"dp": 3, "ranks_per_node": 2 ** 70}}, "/jobs/{job_id}", {200, 201, 400}),
    ("POST", "/jobs/ok", {"json": [1, 2]}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"json": "dp"}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"json": {"dp": 2, "x": {"y": [None] * 1000}}}, "/jobs/{job_id}", {422}),
    ("POST", "/jobs/ok", {"content": b"[" * 20000 + b"]" * 20000, "headers": {"content-type": "application/json"}},
     "/jobs/{job_id}", {400}),  # nested too deep for the JSON parser
    ("POST", "/jobs/ok", {"content": b"\xff\xfe\x00", "headers": {"content-type": "application/json"}},
     "/jobs/{job_id}", {400}),  # not UTF-8
    ("POST", "/jobs/ok", {"content": b"x" * 70000, "headers": {"content-type": "application/json"}},
     "/jobs/{job_id}", {413}),
    ("GET", "/", {"headers": {"host": "attacker.example"}}, "/", {400}),
    ("GET", "/metrics", {"headers": {"host": "localhost.attacker.example:8000"}}, "/metrics", {400}),
    ("GET", "/", {"headers": {"host": "localhost:80@attacker.example"}}, "/", {400}),  # a URL's user info
    ("DELETE", "/jobs/ok", {"headers": {"authorization": "Bearer " + "x" * 10000}}, "/jobs/{job_id}", {401}),
    ("DELETE", "/jobs/ok", {"headers": {"authorization": "Bearer schema-test-tokeN"}}, "/jobs/{job_id}", {401}),
    ("GET", "/jobs/ok/results", {}, "/jobs/{job_id}/results", {200, 404}),
]


def test_abusive_requests_get_documented_4xx(server):
    c = server.client
    schema = c.get("/openapi.json").json()
    auth = {"authorization": f"Bearer {TOKEN}"}
    for method, path, kwargs, route, allowed in ABUSE:
        headers = {**(auth if method != "DELETE" else {}), **kwargs.pop("headers", {})}
        r = c.request(method, path, headers=headers, **kwargs)
        assert r.status_code in allowed, (method, path[:60], r.status_code, r.text[:300])
        assert r.headers["content-type"].startswith("application/json"), (method, path[:60])
        assert isinstance(r.json().get("detail", ""), str)
        if r.status_code >= 400:
            assert documented(schema, method.lower(), route, r.status_code), (method, route, r.status_code)
    assert c.get("/").json()["status"] == "ok"
    # at most --max-jobs 50: the 51st registration is a documented 409, not a 5xx
    codes = [c.post(f"/jobs/fill-{k}", headers=auth).status_code for k in range(60)]
    assert 409 in codes and set(codes) <= {201, 409}
    assert documented(schema, "post", "/jobs/{job_id}", 409)


def raw_status(port: int, request: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        return int(sock.recv(4096).split(b" ", 2)[1])


def test_malformed_http_gets_4xx(server):
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    for request in (
        b"POST /jobs/ok HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"Content-Length: nan\r\n\r\n{}",
        b"POST /jobs/ok HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"Content-Length: -5\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",  # no Host at all
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: attacker.example\r\n\r\n",
    ):
        status = raw_status(server.port, request)
        assert 400 <= status < 500, (request, status)
    assert server.client.get("/").json()["status"] == "ok"


def test_every_error_is_documented_as_a_string_detail(server):
    schema = server.client.get("/openapi.json").json()
    assert schema["components"]["schemas"]["ErrorBody"]["properties"]["detail"]["type"] == "string"
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # FastAPI's array-shaped 422
    for route, methods in schema["paths"].items():
        for method, op in methods.items():
            for status in ("400", "413", *(("422",) if "{job_id}" in route else ())):
                ref = op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", (method, route, status)
    assert schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"].keys() == {"text/plain"}
