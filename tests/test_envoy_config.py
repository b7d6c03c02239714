"""Unit tests of the rendered Envoy bootstrap: the listener's limits come from the settings."""
from __future__ import annotations

import dataclasses

from pathlib import Path
from typing import Any

import pytest
import yaml

from control.envoy_config import render_bootstrap
from control.settings import Settings


def _render(**kw: Any) -> dict[str, Any]:
    return dict(yaml.safe_load(render_bootstrap(Settings(state_dir="/tmp/gw-render-test", **kw))))


def _render_settings(s: Settings) -> dict[str, Any]:
    return dict(yaml.safe_load(render_bootstrap(s)))


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


def test_a_streamed_reply_goes_through_the_relay_and_the_stream_watch_only() -> None:
    """Replies pass the filters in reverse: the ext_proc (which names a stream it hands over), then the
    stream watch, then the Lua relay; both of these only for a reply that carries the ext_proc's header,
    which no model server can send (removed from every upstream reply before the filters see it)."""
    hcm = _hcm(_render(extproc_workers=2))
    names = [f["name"] for f in hcm["http_filters"]]
    assert names[:4] == ["local-reply-mark", "sse-relay", "stream-watch", "envoy.filters.http.ext_proc"]
    relay, watch = hcm["http_filters"][1:3]
    for f in (relay, watch):
        [m] = f["typed_config"]["xds_matcher"]["matcher_list"]["matchers"]
        single = m["predicate"]["not_matcher"]["single_predicate"]
        assert single["input"]["typed_config"]["header_name"] == "x-gateway-stream"
        assert m["on_match"]["action"]["typed_config"]["@type"].endswith("SkipFilter")
    lua = relay["typed_config"]["extension_config"]["typed_config"]
    assert Path(lua["default_source_code"]["filename"]).read_text().count("function envoy_on_response") == 1
    ext = watch["typed_config"]["extension_config"]["typed_config"]
    assert ext["observability_mode"] is True and ext["processing_mode"]["response_body_mode"] == "STREAMED"
    assert ext["grpc_service"]["initial_metadata"] == [{"key": "x-gateway-role", "value": "stream-watch"}]
    assert "retry_policy" in ext["grpc_service"]  # several ext_proc processes: opened on another if refused
    [vhost] = hcm["route_config"]["virtual_hosts"]
    assert vhost["response_headers_to_remove"] == ["x-gateway-stream", "x-gateway-local"]


def test_the_reply_to_a_request_envoy_could_not_read_skips_the_ext_proc() -> None:
    """Envoy's reply to a routed request whose body its codec could not read is marked by
    local_reply_config; the mark has the ext_proc skipped (Envoy closes the connection at once, and a
    reply held for the ext_proc was lost) and is taken off by the first filter, last on the way out."""
    hcm = _hcm(_render(extproc_workers=2))
    mark, ext = hcm["http_filters"][0], hcm["http_filters"][3]
    assert mark["typed_config"]["mutations"] == {"response_mutations": [{"remove": "x-gateway-local"}]}
    [m] = ext["typed_config"]["xds_matcher"]["matcher_list"]["matchers"]
    single = m["predicate"]["single_predicate"]
    assert single["input"]["typed_config"]["header_name"] == "x-gateway-local"
    assert single["value_match"] == {"exact": "malformed"}
    assert m["on_match"]["action"]["typed_config"]["@type"].endswith("SkipFilter")
    inner = ext["typed_config"]["extension_config"]
    assert inner["name"] == "envoy.filters.http.ext_proc"
    assert inner["typed_config"]["@type"].endswith("ext_proc.v3.ExternalProcessor")
    assert "retry_policy" in inner["typed_config"]["grpc_service"]
    marking = [mp for mp in hcm["local_reply_config"]["mappers"]
               if any(h["header"]["key"] == "x-gateway-local" for h in mp.get("headers_to_add", []))]
    assert len(marking) == 1 and marking[0]["headers_to_add"][0]["header"]["value"] == "malformed"
    assert "xds.route_name" in marking[0]["filter"]["extension_filter"]["typed_config"]["expression"]


def test_circuit_breakers_follow_the_connection_limit() -> None:
    """Envoy's default circuit breakers (1,024 per cluster) would refuse long streams beyond 512 (two
    ext_proc streams each) with 500s: the gateway's follow GATEWAY_MAX_CONNECTIONS."""
    from control.envoy_config import clusters
    from core import catalog as catalog_mod
    from conftest import make_catalog
    doc = _render(max_connections=3000)
    [extproc] = [c for c in doc["static_resources"]["clusters"] if c["name"] == "extproc"]
    assert extproc["circuit_breakers"]["thresholds"] == [
        {"max_connections": 6000, "max_pending_requests": 6000, "max_requests": 6000}]
    s = Settings(state_dir="/tmp/gw-render-test", max_connections=3000)
    for c in clusters(catalog_mod.parse(make_catalog(20000)), s):
        assert c["circuit_breakers"]["thresholds"] == [
            {"max_connections": 3000, "max_pending_requests": 3000, "max_requests": 3000}]


def test_envoys_own_error_replies_are_rendered_from_errors_py() -> None:
    """Every reply Envoy writes itself (local_reply_config) is docs/interface.md section 7's error object: the body of
    one of core/errors.py's errors word for word (a client sees one text for one error, whichever
    part refused it), with Envoy's request id, and the status errors.TABLE gives its code."""
    import json
    import re

    from core import errors

    ours = {e.message: e for e in vars(errors).values() if isinstance(e, errors.ApiError)}
    mappers = _hcm(_render())["local_reply_config"]["mappers"]
    assert len(mappers) >= 10
    seen = set()
    for m in mappers:
        text = m["body_format_override"]["text_format_source"]["inline_string"]
        assert m["body_format_override"]["content_type"] == "application/json"
        placeholders = re.findall(r"%[A-Z_]+(?:\([A-Z-]+\))?%", text)
        assert placeholders in (["%REQ(X-REQUEST-ID)%"], ["%RESP(X-REQUEST-ID)%"]), text
        err = json.loads(text.replace(placeholders[0], "rid"))["error"]
        mine = ours[err["message"]]
        assert text.encode() == mine.body(placeholders[0])
        assert err == {"message": mine.message, "type": mine.type, "code": mine.code, "param": None,
                       "request_id": "rid"}
        status = errors.TABLE[mine.code][0]
        if "status_code" in m:
            assert m["status_code"] == status, text
        else:  # the mapper keeps Envoy's status: its filter matches exactly that status
            assert m["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == status, text
        seen.add(mine)
    assert seen == {errors.UNSUPPORTED_ENDPOINT, errors.NO_CAPACITY, errors.UPSTREAM_TIMEOUT, errors.UPSTREAM_FAILED,
                    errors.BODY_TOO_LARGE, errors.HEADERS_TIMEOUT, errors.MALFORMED_REQUEST,
                    errors.REPLY_TOO_LARGE, errors.INTERNAL_ERROR}


def test_every_health_check_times_out_before_the_next_one() -> None:
    """A frozen ext_proc (it accepts the connection and never answers) fails its check within the check's
    own timeout, below the interval, so it is out of the rotation within 1.5 s."""
    def seconds(d: str) -> float:
        assert d.endswith("s"), d
        return float(d[:-1])
    checks = [(c["name"], h) for c in _render()["static_resources"]["clusters"] for h in c.get("health_checks", [])]
    assert [name for name, _ in checks] == ["extproc"]
    for name, h in checks:
        assert seconds(h["timeout"]) < seconds(h["interval"]), (name, h)


def _extproc_addresses(doc: dict[str, Any]) -> list[dict[str, Any]]:
    [cluster] = [c for c in doc["static_resources"]["clusters"] if c["name"] == "extproc"]
    return [e["endpoint"]["address"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]


@pytest.mark.parametrize("state", ["st", "stan z ż/\"q\" it's"])
def test_envoy_reaches_each_ext_proc_by_its_unix_socket_where_asked_and_the_path_fits(state: str) -> None:
    tmp_path = Path("/tmp/gw-render-test")  # (nothing is written there)
    s = Settings.from_env(gateway_port=18000, state_dir=str(tmp_path / state), extproc_workers=2, extproc_unix=True)
    assert [a["pipe"]["path"] for a in _extproc_addresses(_render_settings(s))] == \
        [str(s.state / "run" / f"extproc-{g}.sock") for g in (s.grpc_port, s.grpc_port + 101)]
    # containers (not asked), and a path longer than a Unix socket's 107 bytes: TCP on the loopback
    for other in (dataclasses.replace(s, extproc_unix=False),
                  dataclasses.replace(s, state_dir=str(tmp_path / ("x" * (107 - len(str(tmp_path)))) / state))):
        assert _extproc_addresses(_render_settings(other)) == [
            {"socket_address": {"address": "127.0.0.1", "port_value": g}} for g in (s.grpc_port, s.grpc_port + 101)]
