"""Unit tests of the rendered Envoy bootstrap: the listener's limits come from the settings."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

from control.envoy_config import render_bootstrap
from extproc.settings import Settings


def _render(**kw: Any) -> dict[str, Any]:
    return dict(yaml.safe_load(render_bootstrap(Settings(state_dir="/tmp/gw-render-test", **kw))))


def _hcm(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"])


def test_listener_limits_from_settings() -> None:
    doc = _render(request_headers_timeout_s=7.5, connection_idle_timeout_s=42, max_connections=321,
                  max_streams_per_connection=17)
    hcm = _hcm(doc)
    assert hcm["request_headers_timeout"] == "7.5s"
    assert hcm["common_http_protocol_options"] == {"idle_timeout": "42s"}
    assert hcm["http2_protocol_options"] == {"max_concurrent_streams": 17}
    [monitor] = doc["overload_manager"]["resource_monitors"]
    assert monitor["name"] == "envoy.resource_monitors.global_downstream_max_connections"
    assert monitor["typed_config"]["max_active_downstream_connections"] == 321


def test_listener_limit_defaults() -> None:
    hcm = _hcm(_render())
    assert hcm["request_headers_timeout"] == "10.0s"
    assert hcm["common_http_protocol_options"] == {"idle_timeout": "60.0s"}
    assert hcm["http2_protocol_options"] == {"max_concurrent_streams": 100}


def test_trusted_hops() -> None:
    assert _hcm(_render())["xff_num_trusted_hops"] == 0
    hcm = _hcm(_render(trusted_hops=2))
    assert hcm["xff_num_trusted_hops"] == 2 and hcm["use_remote_address"] is True
    with pytest.raises(ValueError, match="GATEWAY_TRUSTED_HOPS"):
        _render(trusted_hops=-1)
