"""The stores every store-level test runs against: a store joins by adding its name to
STORES, with a fixture `<name>_url` (the file store's is here; a server store's lives in
conftest.py). Test modules import `store_url` (and the `*_url` fixtures it uses)."""

from __future__ import annotations

import pytest

STORES = ["file", "clickhouse"]


@pytest.fixture
def file_url(tmp_path):
    return f"file://{tmp_path}/store"


@pytest.fixture(params=STORES)
def store_url(request):
    return request.getfixturevalue(f"{request.param}_url")
