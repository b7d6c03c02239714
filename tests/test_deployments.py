"""Deployment settings of the catalog (api_key_env, tls, ca_file, sni) and the Envoy clusters rendered
from them."""
from __future__ import annotations

import json
from typing import Any

import pytest

from control import envoy_config
from core.catalog import CatalogError, parse
from control.settings import Settings


def _doc(*deployments: dict[str, Any]) -> dict[str, Any]:
    return {"aliases": {"a": {"capabilities": ["chat"], "context_length": 8, "max_output_tokens": 4,
                              "prices": [{"effective": "2026-01-01T00:00:00Z", "input_micro_pln_per_1m": 1,
                                          "output_micro_pln_per_1m": 1}],
                              "upstreams": [{"model": "m"}]}},
            "upstream_models": {"m": {"deployments": list(deployments)}}}


def _cluster(monkeypatch: pytest.MonkeyPatch, *deployments: dict[str, Any]) -> dict[str, Any]:
    monkeypatch.setenv("M_KEY", "sk-upstream-secret")
    (c,) = envoy_config.clusters(parse(_doc(*deployments)), Settings.from_env())
    return c


@pytest.mark.parametrize("bad,field", [
    ({"api_key_env": "sk-abc def"}, "api_key_env"), ({"api_key_env": 5}, "api_key_env"),
    ({"tls": "yes"}, "tls"), ({"ca_file": "/ca.pem"}, "ca_file"), ({"sni": "x.test"}, "sni"),
    ({"tls": True, "sni": ""}, "sni")])
def test_bad_settings_are_refused_naming_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(CatalogError) as e:
        parse(_doc({"host": "h", "port": 1, **bad}))
    assert f"deployments[0].{field}:" in str(e.value)
    assert "sk-abc" not in str(e.value)


def test_one_key_per_upstream_model() -> None:
    """Envoy picks the deployment after the model's headers are set: deployments of one model that name
    different keys (or a key and none) could be sent each other's, so they are refused."""
    for second in ({"api_key_env": "OTHER"}, {}):
        with pytest.raises(CatalogError, match=r"deployments\[1\]\.api_key_env"):
            parse(_doc({"host": "h", "port": 1, "api_key_env": "M_KEY"}, {"host": "g", "port": 1, **second}))


def test_plain_deployment_renders_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _cluster(monkeypatch, {"host": "10.0.0.1", "port": 8000})
    assert "transport_socket_matches" not in c and "typed_extension_protocol_options" not in c
    (ep,) = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert ep["endpoint"]["hostname"] == "10.0.0.1" and "metadata" not in ep


def test_a_port_relative_to_the_gateways(monkeypatch: pytest.MonkeyPatch) -> None:
    """``port_offset``: the port follows GATEWAY_PORT (each stack on a machine its own simulators)."""
    (d,) = parse(_doc({"host": "127.0.0.1", "port_offset": 15})).deployments["m"]
    assert (d.port, d.port_offset, d.port_at(8080), d.port_at(20000)) == (0, 15, 8095, 20015)
    monkeypatch.setenv("GATEWAY_PORT", "20000")
    c = _cluster(monkeypatch, {"host": "127.0.0.1", "port_offset": 15})
    (ep,) = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert ep["endpoint"]["address"]["socket_address"]["port_value"] == 20015
    for both in ({"port": 1, "port_offset": 2}, {}):
        with pytest.raises(CatalogError, match=r"deployments\[0\]: give either port or port_offset"):
            parse(_doc({"host": "h", **both}))
    with pytest.raises(CatalogError, match=r"deployments\[0\]\.port_offset: must be an integer >= 1"):
        parse(_doc({"host": "h", "port_offset": "15"}))


def test_key_set_from_envoys_environment_never_written(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _cluster(monkeypatch, {"host": "10.0.0.1", "port": 8000, "api_key_env": "M_KEY"},
                 {"host": "10.0.0.2", "port": 8000, "api_key_env": "M_KEY"})
    text = json.dumps(c)
    assert "sk-upstream-secret" not in text
    filters = c["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"][
        "http_filters"]
    assert [f["name"] for f in filters] == ["envoy.filters.http.header_mutation", "envoy.filters.http.upstream_codec"]
    (m,) = filters[0]["typed_config"]["mutations"]["request_mutations"]
    assert m["append"] == {"header": {"key": "authorization", "value": "Bearer %ENVIRONMENT(M_KEY)%"},
                           "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


def test_missing_key_variable_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_KEY", raising=False)
    with pytest.raises(ValueError, match="NOT_SET_KEY"):
        envoy_config.clusters(parse(_doc({"host": "h", "port": 1, "api_key_env": "NOT_SET_KEY"})),
                              Settings.from_env())


def test_tls_per_deployment_verified(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    c = _cluster(monkeypatch, {"host": "10.0.0.1", "port": 8000},
                 {"host": "api.example.com", "port": 443, "tls": True},
                 {"host": "10.0.0.3", "port": 8443, "tls": True, "ca_file": str(ca), "sni": "gpu.internal"})
    assert c["type"] == "STRICT_DNS"
    eps = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert "metadata" not in eps[0]  # the plain one keeps the cluster's plain socket
    matches = {m["match"]["gateway_tls"]: m["transport_socket"]["typed_config"] for m in c["transport_socket_matches"]}
    hosted = matches[eps[1]["metadata"]["filter_metadata"]["envoy.transport_socket_match"]["gateway_tls"]]
    own = matches[eps[2]["metadata"]["filter_metadata"]["envoy.transport_socket_match"]["gateway_tls"]]
    assert hosted["sni"] == "api.example.com"
    assert hosted["common_tls_context"]["validation_context"]["trusted_ca"]["filename"] == envoy_config.system_ca_file()
    assert hosted["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": "api.example.com"}}]
    assert own["sni"] == "gpu.internal"
    assert [e["endpoint"]["hostname"] for e in eps] == ["10.0.0.1", "api.example.com", "gpu.internal"]
    assert own["common_tls_context"]["validation_context"]["trusted_ca"]["filename"] == str(ca.resolve())
