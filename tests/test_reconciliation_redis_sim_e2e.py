"""The reconciliation cells (tests/test_reconciliation_e2e.py) of Redis and a model server: each killed,
paused 5 s and paused 30 s under the mixed load, on a stack of this module's, then every request reconciled
by its id against its record, the ledger and the balance."""
from __future__ import annotations

from typing import Iterator

import pytest

from conftest import Gateway, running_stack
from test_reconciliation_e2e import FAULTS, cell


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with running_stack("gw-reconcile-redis-", default_rpm=100000, default_concurrency=1000) as g:
        yield g


@pytest.mark.parametrize("how", FAULTS)
@pytest.mark.parametrize("component", ["redis", "sim:sim-a"])
def test_each_request_is_billed_and_logged_as_its_client_saw_it(gw: Gateway, component: str, how: str) -> None:
    cell(gw, component, how)
