from conftest import Gateway, assert_error


def test_models_list_requires_key(gateway: Gateway) -> None:
    import httpx
    r = httpx.get(gateway.v1 + "/models")
    assert_error(r, 401, "invalid_api_key", "authentication_error")


def test_metrics_endpoint_counts_requests_without_content(gateway: Gateway) -> None:
    import httpx
    org, kid, key = gateway.new_org()
    canary = "CANARY-metrics-7f3a"
    r = httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": canary}]})
    assert r.status_code == 200
    httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
               json={"model": "nope", "messages": [{"role": "user", "content": canary}]})
    m = httpx.get(f"http://127.0.0.1:{gateway.stack.s.metrics_http_port}/metrics").text
    assert canary not in m and key not in m and kid not in m and org not in m
    assert 'gateway_requests_total{alias="polish-pro",code="",endpoint="chat",status="200"}' in m
    assert 'gateway_requests_total{alias="-",code="model_not_found",endpoint="chat",status="404"}' in m
    assert 'gen_ai_client_token_usage_count{gen_ai_request_model="polish-pro",gen_ai_response_model="polish-pro",gen_ai_token_type="output"}' in m
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in m
    assert 'gateway_key_cache_lookups_total{result="miss"}' in m
    assert 'gateway_extproc_phase_seconds_count{phase="request_body"}' in m
    # Envoy's own statistics beside them, from the same port
    assert "envoy_cluster_upstream_rq_total{envoy_cluster_name=\"upstream_up-pro\"}" in m
    # and per deployment (upstream host): requests, errors, connection failures
    assert 'envoy_cluster_endpoint_rq_success_total{envoy_cluster_name="upstream_up-pro",envoy_endpoint_address=' in m
    # the public listener does not serve it
    assert httpx.get(gateway.url + "/metrics", headers={"Authorization": f"Bearer {key}"}).status_code == 404


def test_envoy_closes_extproc_streams_gracefully(gateway: Gateway) -> None:
    """Envoy half-closes each ext_proc stream and waits for its status instead of resetting it (a reset
    stream leaks memory in grpcio's asyncio server: BENCHMARKS.md, Soak)."""
    import httpx
    rt = httpx.get(f"http://127.0.0.1:{gateway.stack.s.envoy_admin_port}/runtime").json()
    entry = rt["entries"]["envoy.reloadable_features.ext_proc_graceful_grpc_close"]
    assert entry["final_value"] == "true", entry


def test_envoy_reaches_the_ext_proc_and_the_ext_proc_redis_by_unix_sockets_in_the_private_state(
        gateway: Gateway) -> None:
    """`gateway up` runs them side by side: Unix sockets in the state directory (this account's alone),
    the TCP ports kept for probes and tools."""
    import os
    import stat
    import httpx
    from core.urls import parse_redis
    state = gateway.stack.state
    admin = f"http://127.0.0.1:{gateway.stack.s.envoy_admin_port}"
    [cluster] = [c for c in httpx.get(admin + "/clusters?format=json").json()["cluster_statuses"]
                 if c["name"] == "extproc"]
    [host] = cluster["host_statuses"]
    sock = state / "run" / f"extproc-{gateway.stack.s.grpc_port}.sock"
    assert host["address"] == {"pipe": {"path": str(sock)}}
    assert host["health_status"]["eds_health_status"] == "HEALTHY"
    redis_sock = parse_redis(gateway.stack.redis_url).unix_path
    assert redis_sock == str(state / "redis" / "redis.sock")
    for path in (sock, state / "redis" / "redis.sock"):
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    _, _, key = gateway.new_org()
    before = host["stats"]
    r = httpx.post(gateway.v1 + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "polish-pro", "messages": [{"role": "user", "content": "Cześć"}]})
    assert r.status_code == 200 and r.json()["model"] == "polish-pro"
    [after] = [c for c in httpx.get(admin + "/clusters?format=json").json()["cluster_statuses"]
               if c["name"] == "extproc"][0]["host_statuses"]
    count = lambda stats: next(int(s.get("value", 0)) for s in stats if s["name"] == "rq_total")  # noqa: E731
    assert count(after["stats"]) > count(before)  # the request's gRPC calls went over the socket
    # the ext_proc's TCP port still answers its health check (probes, `gateway status`)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(f"127.0.0.1:{gateway.stack.s.grpc_port}") as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
