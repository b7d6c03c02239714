"""deploy/k8s agrees with the code and with the Kubernetes API schemas (kubernetes-validate ships them: no
cluster, no network).

Settings names come from control/settings.py (ENV_VARS), ports from Settings with the manifests'
environment, the catalog from control/catalog.yaml; selectors match labels, the HPA and the PDB target
the gateway Deployment, probes and the drain hook point at declared container ports, and the Envoy
config the image's entrypoint renders with that environment listens where the manifests say."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from core import catalog as catalog_mod
from control.settings import ENV_VARS, Settings

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
CATALOG = ROOT / "control" / "catalog.yaml"
ENTRYPOINT = ROOT / "deploy" / "docker" / "entrypoint.py"
LOOPBACK_PORT = re.compile(r"127\.0\.0\.1:(\d+)")


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    doc = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert doc["kind"] == "Kustomization"
    return doc


@pytest.fixture(scope="module")
def objects(kustomization: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for res in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / res).read_text()):
            if doc is None:
                continue
            assert {"apiVersion", "kind", "metadata"} <= set(doc), res
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, f"{key} defined twice"
            out[key] = doc
    return out


def get(objects: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    assert (kind, name) in objects, f"no {kind} {name} in deploy/k8s"
    return objects[(kind, name)]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def containers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_spec(obj)["containers"]}


def ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def env_of(objects: dict[tuple[str, str], dict[str, Any]], c: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(get(objects, "ConfigMap", src["configMapRef"]["name"])["data"])
        if "secretRef" in src:
            env.update(get(objects, "Secret", src["secretRef"]["name"])["stringData"])
    for e in c.get("env", []):
        env[e["name"]] = str(e.get("value", ""))
    return env


def settings_of(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ENV_VARS.values():
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Settings.from_env()


def probe_ports(probe: dict[str, Any], c: dict[str, Any]) -> list[int]:
    """The container ports a probe or hook reaches: httpGet/tcpSocket/grpc ports (by name or number),
    or the loopback ports an exec command dials."""
    declared = ports(c)
    out: list[int] = []
    for kind in ("httpGet", "tcpSocket", "grpc"):
        if kind in probe:
            p = probe[kind]["port"]
            out.append(declared[p] if isinstance(p, str) else int(p))
    if "exec" in probe:
        out.extend(int(p) for p in LOOPBACK_PORT.findall(" ".join(probe["exec"]["command"])))
    return out


# ---- files and kinds ----------------------------------------------------------------------------

def test_every_manifest_is_listed_and_parses(kustomization: dict[str, Any],
                                            objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, f"kustomization.yaml resources differ from the files: {listed ^ on_disk}"
    kinds = {k for k, _ in objects}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap", "Secret",
            "Ingress", "NetworkPolicy"} <= kinds
    ns = kustomization["namespace"]
    assert get(objects, "Namespace", ns)
    for (kind, name), obj in objects.items():
        assert "namespace" not in obj["metadata"] or obj["metadata"]["namespace"] == ns, (kind, name)


def test_env_var_names_are_settings(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    known = set(ENV_VARS.values())
    settings = get(objects, "ConfigMap", "gateway-settings")["data"]
    secret = get(objects, "Secret", "gateway-secrets")["stringData"]
    names = set(settings) | set(secret)
    for obj in objects.values():
        if obj["kind"] in ("Deployment", "Job"):
            for c in containers(obj).values():
                names |= {e["name"] for e in c.get("env", [])}
    unknown = sorted(names - known)
    assert not unknown, f"deploy/k8s sets variables that control/settings.py does not read: {unknown}"
    assert {"DATABASE_URL", "REDIS_URL"} <= set(secret), "PostgreSQL and Redis are given by URL in the Secret"
    assert not {"DATABASE_URL", "REDIS_URL"} & set(settings), "URLs (with passwords) belong in the Secret"
    assert secret["DATABASE_URL"].startswith("postgresql://") and secret["REDIS_URL"].startswith("redis")
    assert all(isinstance(v, str) for v in {**settings, **secret}.values()), "ConfigMap/Secret values are strings"


# ---- the gateway pods ---------------------------------------------------------------------------

def test_gateway_pod_runs_envoy_and_extproc(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    dep = get(objects, "Deployment", "gateway")
    cs = containers(dep)
    assert set(cs) == {"envoy", "extproc"}
    assert cs["envoy"]["image"] == cs["extproc"]["image"]
    # the image's entrypoint (deploy/docker/entrypoint.py) runs these: `command` would replace it
    assert "command" not in cs["envoy"] and "command" not in cs["extproc"]
    assert cs["envoy"]["args"][0] == "envoy"
    assert cs["extproc"]["args"] == ["python", "-m", "extproc"]
    assert 'cmd == "envoy"' in ENTRYPOINT.read_text() and 'cmd == "migrate"' in ENTRYPOINT.read_text()
    for c in cs.values():
        res = c["resources"]
        assert {"cpu", "memory"} <= set(res["requests"]) and {"cpu", "memory"} <= set(res["limits"]), c["name"]
        assert c["readinessProbe"] and c["livenessProbe"], c["name"]


def test_ports_agree_with_settings(objects: dict[tuple[str, str], dict[str, Any]],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    dep = get(objects, "Deployment", "gateway")
    cs = containers(dep)
    envoy_env, ext_env = env_of(objects, cs["envoy"]), env_of(objects, cs["extproc"])
    s = settings_of(envoy_env, monkeypatch)
    x = settings_of(ext_env, monkeypatch)
    assert (s.gateway_port, s.grpc_port, s.envoy_admin_port, s.catalog) == \
        (x.gateway_port, x.grpc_port, x.envoy_admin_port, x.catalog)
    assert s.gateway_host == "0.0.0.0", "Envoy must listen on the pod address"
    assert ports(cs["envoy"]) == {"http": s.gateway_port, "envoy-admin": s.envoy_admin_port}
    assert ports(cs["extproc"]) == {"extproc-grpc": x.grpc_port, "metrics": x.metrics_http_port}
    assert x.metrics_http_port == 9464 and x.metrics_host == "0.0.0.0", "metrics scraped from the pod address"
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == x.metrics_http_port
    assert ann["prometheus.io/path"] == "/metrics"
    assert not x.run_sim


def test_probes_and_drain_point_at_declared_ports(objects: dict[tuple[str, str], dict[str, Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    dep = get(objects, "Deployment", "gateway")
    cs = containers(dep)
    s = settings_of(env_of(objects, cs["envoy"]), monkeypatch)
    envoy, ext = cs["envoy"], cs["extproc"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe_ports(envoy[probe], envoy) == [s.envoy_admin_port]
        assert "/ready" in " ".join(envoy[probe]["exec"]["command"])
        assert probe_ports(ext[probe], ext) == [s.grpc_port]
        assert "HealthStub" in " ".join(ext[probe]["exec"]["command"])
        for c in (envoy, ext):
            assert set(probe_ports(c[probe], c)) <= set(ports(c).values()), (c["name"], probe)
    # the drain is SIGTERM's, as under `gateway up`: the image's Envoy drains itself, the ext_proc drains
    # it too and serves what it still relays; the budget covers a stream's whole upstream budget
    assert envoy["args"][0] == "envoy" and "--drain-time-s" not in envoy["args"]
    assert "lifecycle" not in ext
    pre = " ".join(envoy["lifecycle"]["preStop"]["exec"]["command"])
    envoy_wait = int(re.search(r"sleep (\d+)", pre).group(1))  # type: ignore[union-attr]
    assert "drain_listeners" not in pre and envoy_wait <= 10
    ext_s = settings_of(env_of(objects, ext), monkeypatch)
    assert ext_s.drain_envoy_on_stop and ext_s.envoy_admin_port == s.envoy_admin_port
    assert s.drain_grace_s == ext_s.drain_grace_s >= ext_s.total_timeout_s
    grace = pod_spec(dep)["terminationGracePeriodSeconds"]
    assert grace >= envoy_wait + ext_s.drain_grace_s + 20


def test_selectors_match_labels(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    pods = {name: obj["spec"]["template"]["metadata"]["labels"] for (kind, name), obj in objects.items()
            if kind in ("Deployment", "Job")}
    for (kind, name), obj in objects.items():
        if kind == "Deployment":
            sel = obj["spec"]["selector"]["matchLabels"]
            assert sel.items() <= pods[name].items(), name
    for svc, target in (("gateway", "gateway"), ("console", "console")):
        sel = get(objects, "Service", svc)["spec"]["selector"]
        matching = [n for n, labels in pods.items() if sel.items() <= labels.items()]
        assert matching == [target], (svc, matching)
    pdb = get(objects, "PodDisruptionBudget", "gateway")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods["gateway"].items()
    assert [n for n, labels in pods.items() if pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()] \
        == ["gateway"]
    assert pdb["spec"].get("minAvailable", 0) >= 1 or "maxUnavailable" in pdb["spec"]


def test_hpa_targets_the_gateway(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    hpa = get(objects, "HorizontalPodAutoscaler", "gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", "gateway")
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert get(objects, "PodDisruptionBudget", "gateway")["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]
    # CPU utilisation needs CPU requests on every container of the pod
    assert all("cpu" in c["resources"]["requests"] for c in containers(get(objects, "Deployment", "gateway")).values())


def test_services_target_declared_ports(objects: dict[tuple[str, str], dict[str, Any]],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for svc, dep in (("gateway", "gateway"), ("console", "console")):
        declared: dict[str, int] = {}
        for c in containers(get(objects, "Deployment", dep)).values():
            declared.update(ports(c))
        for p in get(objects, "Service", svc)["spec"]["ports"]:
            t = p["targetPort"]
            assert (t in declared) if isinstance(t, str) else (t in declared.values()), (svc, p)
    gw = {p["name"]: p for p in get(objects, "Service", "gateway")["spec"]["ports"]}
    assert list(gw) == ["http"] and gw["http"]["port"] == Settings().gateway_port, "the public Service: the API only"
    assert [p["name"] for p in get(objects, "Service", "console")["spec"]["ports"]] == ["http"]


def test_metrics_have_services_of_their_own(objects: dict[tuple[str, str], dict[str, Any]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The ext_proc's and the usage writer's metrics ports, each behind a headless Service of its own
    (for the ServiceMonitor), never behind a public one."""
    for svc, dep, container in (("gateway-metrics", "gateway", "extproc"),
                                ("usage-writer-metrics", "usage-writer", "usage-writer")):
        service = get(objects, "Service", svc)
        pod_labels = get(objects, "Deployment", dep)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items(), svc
        assert service["spec"]["clusterIP"] == "None" and service["metadata"]["labels"]["llm-gateway-metrics"] == "true"
        c = containers(get(objects, "Deployment", dep))[container]
        s = settings_of(env_of(objects, c), monkeypatch)
        want = s.metrics_http_port if container == "extproc" else s.writer_metrics_http_port
        assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [("metrics", want, "metrics")]
        assert ports(c)["metrics"] == want
    for (kind, name), obj in objects.items():
        if kind == "Service" and name not in ("gateway-metrics", "usage-writer-metrics"):
            assert all(p["name"] != "metrics" and p["port"] not in (9464, 8094) for p in obj["spec"]["ports"]), name


def test_volumes_and_catalog_path(objects: dict[tuple[str, str], dict[str, Any]],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for (kind, name), obj in objects.items():
        if kind != "Deployment":
            continue
        vols = {v["name"]: v for v in pod_spec(obj).get("volumes", [])}
        for c in containers(obj).values():
            s = settings_of(env_of(objects, c), monkeypatch)
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert set(mounts.values()) <= set(vols), (name, c["name"])
            # the state dir (rendered Envoy config, console secret fallback) is writable: an emptyDir
            assert "emptyDir" in vols[mounts[s.state_dir]], (name, c["name"])
            if name == "gateway":
                cat_dir, cat_file = s.catalog.rsplit("/", 1)
                vol = vols[mounts[cat_dir]]
                cm = get(objects, "ConfigMap", vol["configMap"]["name"])
                assert cat_file in cm["data"]


def test_catalog_configmap_matches_the_catalog(objects: dict[tuple[str, str], dict[str, Any]],
                                               tmp_path: Path) -> None:
    text = get(objects, "ConfigMap", "gateway-catalog")["data"]["catalog.yaml"]
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    k8s = catalog_mod.load(path)  # a valid catalog for the ext_proc
    demo = catalog_mod.load(CATALOG)
    ours, theirs = yaml.safe_load(text), yaml.safe_load(CATALOG.read_text())
    assert ours["aliases"] == theirs["aliases"], "aliases, limits, prices and upstreams as control/catalog.yaml"
    assert set(ours["upstream_models"]) == set(theirs["upstream_models"])
    assert set(k8s.aliases) == set(demo.aliases)
    for model in ours["upstream_models"].values():
        for d in model["deployments"]:
            assert d["host"] not in ("127.0.0.1", "localhost"), "no simulator runs in the cluster"


# ---- console and migrations ---------------------------------------------------------------------

def test_console_deployment(objects: dict[tuple[str, str], dict[str, Any]],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    dep = get(objects, "Deployment", "console")
    (c,) = containers(dep).values()
    assert c["args"] == ["python", "-m", "control.console"]
    s = settings_of(env_of(objects, c), monkeypatch)
    assert s.console_http_port == 8081 and ports(c) == {"http": 8081}
    assert s.gateway_host == "0.0.0.0", "the console listens on GATEWAY_HOST"
    assert s.console_secret and s.smtp_host, "console secret and SMTP server are set (no local capture)"
    from control.console.launch import refusal
    assert refusal(s) is None, "the console's production checks pass with these settings"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
        assert probe_ports(c[probe], c) == [8081]
    assert get(objects, "Service", "console")["spec"]["ports"][0]["port"] == 8081
    gw_image = containers(get(objects, "Deployment", "gateway"))["envoy"]["image"]
    assert c["image"] == gw_image


def test_usage_writer_deployment(objects: dict[tuple[str, str], dict[str, Any]],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    dep = get(objects, "Deployment", "usage-writer")
    (c,) = containers(dep).values()
    assert c["args"] == ["python", "-m", "extproc.usage_writer"]
    s = settings_of(env_of(objects, c), monkeypatch)
    assert s.database_url and s.redis_url, "the writer reaches PostgreSQL and Redis by URL"
    assert ports(c) == {"metrics": s.writer_metrics_http_port} and s.metrics_host == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert probe_ports(c[probe], c) == [s.writer_metrics_http_port]
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert int(ann["prometheus.io/port"]) == s.writer_metrics_http_port  # the write-lag metric and its alerts
    assert c["image"] == containers(get(objects, "Deployment", "gateway"))["envoy"]["image"]
    # not behind the gateway's Service, HPA or PDB
    gw_sel = get(objects, "Service", "gateway")["spec"]["selector"]
    assert not gw_sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_migrations_run_before_every_pod(objects: dict[tuple[str, str], dict[str, Any]],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Deployment whose pods use PostgreSQL starts with the init container `migrate` (the image's
    `gateway migrate`: idempotent, under an advisory lock), on the same image and settings."""
    gw_image = containers(get(objects, "Deployment", "gateway"))["envoy"]["image"]
    deployments = {name: obj for (kind, name), obj in objects.items() if kind == "Deployment"}
    assert set(deployments) == {"gateway", "usage-writer", "console"}
    for name, dep in deployments.items():
        (init,) = pod_spec(dep)["initContainers"]
        assert init["name"] == "migrate" and init["args"] == ["migrate"] and "command" not in init, name
        assert init["image"] == gw_image
        assert settings_of(env_of(objects, init), monkeypatch).database_url.startswith("postgresql://")
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert not [k for k in objects if k[0] == "Job"], "no separate Job: kubectl apply would not order it"


def test_logs_go_to_standard_output(objects: dict[tuple[str, str], dict[str, Any]],
                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Envoy's access log goes to the container's standard output, not to a file in the pod's small
    emptyDir (about 280 bytes a request would fill it and get the pod evicted)."""
    from control import envoy_config
    envoy = containers(get(objects, "Deployment", "gateway"))["envoy"]
    env = env_of(objects, envoy)
    env.update(GATEWAY_STATE_DIR=str(tmp_path / "state"))
    s = settings_of(env, monkeypatch)
    assert s.envoy_access_log == "/dev/stdout"
    boot = yaml.safe_load(envoy_config.render_bootstrap(s))
    files = [log["typed_config"]["path"] for listener in boot["static_resources"]["listeners"]
             for chain in listener["filter_chains"] for f in chain["filters"]
             for log in f["typed_config"].get("access_log", []) if "path" in log["typed_config"]]
    assert files == ["/dev/stdout"]


def test_certificates_for_the_urls_are_mounted_read_only(objects: dict[tuple[str, str], dict[str, Any]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """REDIS_URL (rediss://, ssl_ca_certs) and DATABASE_URL (verify-full, sslrootcert) name files of the
    gateway-certs Secret, mounted read-only where every container that reaches them (the init containers
    too) finds them, on a read-only root filesystem."""
    from urllib.parse import parse_qs, urlsplit

    from core.urls import parse_redis
    secret = get(objects, "Secret", "gateway-secrets")["stringData"]
    db_query = parse_qs(urlsplit(secret["DATABASE_URL"]).query)
    assert db_query["sslmode"] == ["verify-full"]
    redis = parse_redis(secret["REDIS_URL"])
    assert secret["REDIS_URL"].startswith("rediss://") and redis.tls is not None and redis.tls.ca_certs
    files = [db_query["sslrootcert"][0], redis.tls.ca_certs]
    certs = get(objects, "Secret", "gateway-certs")["stringData"]
    users = 0
    for (kind, name), obj in objects.items():
        if kind != "Deployment":
            continue
        vols = {v["name"]: v for v in pod_spec(obj).get("volumes", [])}
        for c in [*pod_spec(obj).get("initContainers", []), *pod_spec(obj)["containers"]]:
            if {"secretRef": {"name": "gateway-secrets"}} not in c.get("envFrom", []) or c["name"] == "envoy":
                continue
            users += 1
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            for f in files:
                directory, file = f.rsplit("/", 1)
                (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == directory]
                assert mount.get("readOnly") is True, (name, c["name"])
                assert vols[mount["name"]]["secret"]["secretName"] == "gateway-certs"
                assert "BEGIN CERTIFICATE" in certs[file], file
    assert users == 6  # 3 init containers, the ext_proc, the usage writer, the console


def test_ingress_with_tls_and_trusted_hops(objects: dict[tuple[str, str], dict[str, Any]],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ingress terminates TLS for every host it routes, to the public Services' declared ports; the
    one proxy it adds is trusted for the client's address (GATEWAY_TRUSTED_HOPS=1) by Envoy and the
    console alike, and streamed replies are not buffered."""
    ing = get(objects, "Ingress", "gateway")
    hosts = {r["host"] for r in ing["spec"]["rules"]}
    assert hosts and hosts <= {h for t in ing["spec"]["tls"] for h in t["hosts"]} and ing["spec"]["tls"][0]["secretName"]
    backends = {(r["host"], p["path"]): (p["backend"]["service"]["name"], p["backend"]["service"]["port"]["name"])
                for r in ing["spec"]["rules"] for p in r["http"]["paths"]}
    assert sorted(backends.values()) == [("console", "http"), ("gateway", "http")]
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    for dep, container in (("gateway", "envoy"), ("console", "console")):
        c = containers(get(objects, "Deployment", dep))[container]
        assert settings_of(env_of(objects, c), monkeypatch).trusted_hops == 1, dep


def test_network_policies(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Nothing may connect unless allowed: the ingress controller to the API and the console, the
    monitoring namespace to the metrics ports; no policy opens Envoy's admin or the ext_proc's gRPC port."""
    policies = {name: obj["spec"] for (kind, name), obj in objects.items() if kind == "NetworkPolicy"}
    deny = policies["default-deny-ingress"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    pods = {name: obj["spec"]["template"]["metadata"]["labels"] for (kind, name), obj in objects.items()
            if kind == "Deployment"}
    opened: dict[str, set[tuple[str, str]]] = {name: set() for name in pods}
    for spec in policies.values():
        sel = spec["podSelector"].get("matchLabels", {})
        for rule in spec.get("ingress", []):
            (source,) = rule["from"]
            ns = source["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for name, labels in pods.items():
                if sel.items() <= labels.items():
                    opened[name] |= {(ns, p["port"]) for p in rule["ports"]}
    assert opened == {"gateway": {("ingress-nginx", "http"), ("monitoring", "metrics")},
                      "console": {("ingress-nginx", "http")},
                      "usage-writer": {("monitoring", "metrics")}}
    for name, opened_ports in opened.items():  # the names are the pods' declared ports
        declared = {p for c in containers(get(objects, "Deployment", name)).values() for p in ports(c)}
        assert {p for _, p in opened_ports} <= declared, name


def test_monitoring_objects(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """deploy/k8s/monitoring (Prometheus Operator): the ServiceMonitor selects exactly the metrics Services
    on their `metrics` port, with job names the alert rules use; the PrometheusRule carries the alert
    rules of deploy/prometheus/alerts.yaml unchanged."""
    mon = K8S / "monitoring"
    kust = yaml.safe_load((mon / "kustomization.yaml").read_text())
    assert kust["namespace"] == yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    docs = {doc["kind"]: doc for res in kust["resources"] for doc in yaml.safe_load_all((mon / res).read_text())}
    assert set(docs) == {"ServiceMonitor", "PrometheusRule"}
    assert {d["apiVersion"] for d in docs.values()} == {"monitoring.coreos.com/v1"}
    sm = docs["ServiceMonitor"]["spec"]
    selected = {name: obj for (kind, name), obj in objects.items() if kind == "Service"
                and sm["selector"]["matchLabels"].items() <= obj["metadata"].get("labels", {}).items()}
    assert set(selected) == {"gateway-metrics", "usage-writer-metrics"}
    assert [e["port"] for e in sm["endpoints"]] == ["metrics"]
    assert {obj["metadata"]["labels"][sm["jobLabel"]] for obj in selected.values()} == {"gateway", "usage-writer"}
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    assert docs["PrometheusRule"]["spec"]["groups"] == alerts["groups"]
    jobs = [j["job_name"] for j in yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
            ["scrape_configs"]]
    assert sorted(jobs) == ["gateway", "usage-writer"]


def test_rendered_envoy_config_matches(objects: dict[tuple[str, str], dict[str, Any]],
                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The entrypoint's rendering with the pod's settings: the listener and admin ports the manifests
    declare, and clusters for the ConfigMap catalog's model servers (DNS names)."""
    from control import envoy_config

    cs = containers(get(objects, "Deployment", "gateway"))
    env = env_of(objects, cs["envoy"])
    cat = tmp_path / "catalog.yaml"
    cat.write_text(get(objects, "ConfigMap", "gateway-catalog")["data"]["catalog.yaml"])
    env.update(GATEWAY_STATE_DIR=str(tmp_path / "state"), GATEWAY_CATALOG=str(cat))
    s = settings_of(env, monkeypatch)
    cds = envoy_config.write_cds(catalog_mod.load(cat), s)
    boot = envoy_config.write_bootstrap(s)
    text = Path(boot).read_text()
    assert f"port_value: {s.gateway_port}" in text or f'"port_value": {s.gateway_port}' in text
    assert str(s.envoy_admin_port) in text and str(s.grpc_port) in text
    clusters = Path(cds).read_text() if cds else (s.state / "envoy" / "cds.yaml").read_text()
    assert "vllm-a.models.svc.cluster.local" in clusters


def _api_objects() -> list[tuple[str, dict[str, Any]]]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [(f"{res}:{doc['kind']}/{doc['metadata']['name']}", doc) for res in kust["resources"]
            for doc in yaml.safe_load_all((K8S / res).read_text()) if doc is not None]


# The oldest Kubernetes the manifests target (autoscaling/v2, policy/v1, seccompProfile, sizeLimit) and
# the newest whose schemas kubernetes-validate ships; strict: a misspelt or unknown field is an error.
@pytest.mark.parametrize("version", ["1.29.0", "latest"])
@pytest.mark.parametrize("name,doc", _api_objects(), ids=[n for n, _ in _api_objects()])
def test_every_manifest_is_valid_against_the_kubernetes_api_schema(name: str, doc: dict[str, Any],
                                                                   version: str) -> None:
    import kubernetes_validate
    if version == "latest":
        version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_catches_a_misspelt_field() -> None:
    import kubernetes_validate
    doc = yaml.safe_load((K8S / "gateway-pdb.yaml").read_text())
    doc["spec"]["minAvailabel"] = doc["spec"].pop("minAvailable", 1)
    with pytest.raises(kubernetes_validate.ValidationError, match="minAvailabel"):
        kubernetes_validate.validate(doc, "1.29.0", strict=True)
    dep = yaml.safe_load((K8S / "gateway-deployment.yaml").read_text())
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "5"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, "1.29.0", strict=True)


def test_the_extproc_probes_tell_serving_from_not(gateway: Any) -> None:
    """The probe commands themselves, run against the suite's real ext_proc (its port in place of the
    pod's): ready and live while it serves; neither while it does not answer (stopped), so a hung
    ext_proc leaves the Service's endpoints and, past the liveness threshold, is restarted."""
    import os
    import signal
    import subprocess
    import sys
    dep = yaml.safe_load((K8S / "gateway-deployment.yaml").read_text())
    ext = containers(dep)["extproc"]
    port = gateway.stack.s.grpc_port

    def run(probe: str) -> int:
        argv = [sys.executable if a == "python" else a.replace("127.0.0.1:8090", f"127.0.0.1:{port}")
                for a in ext[probe]["exec"]["command"]]
        return subprocess.run(argv, capture_output=True, timeout=ext[probe]["timeoutSeconds"] + 5).returncode

    assert run("readinessProbe") == 0 and run("livenessProbe") == 0
    pid = gateway.stack.procs["extproc"].popen.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        assert run("readinessProbe") != 0 and run("livenessProbe") != 0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert run("readinessProbe") == 0


def test_every_probe_times_out_before_the_next_one(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    probes = [(name, c["name"], kind, c[kind]) for (k, name), doc in objects.items() if k == "Deployment"
              for c in doc["spec"]["template"]["spec"]["containers"]
              for kind in ("readinessProbe", "livenessProbe", "startupProbe") if kind in c]
    assert len(probes) >= 6, probes
    for name, container, kind, p in probes:
        assert p["timeoutSeconds"] < p.get("periodSeconds", 10), (name, container, kind, p)


@pytest.mark.parametrize("option,shape", [("redis-cluster", "cluster"), ("redis-sentinel", "sentinel")])
def test_the_redis_options_patch_the_secret_with_a_url_the_gateway_reads(option: str, shape: str,
                                                                         objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """deploy/k8s/<option>: a kustomize Component whose one patch gives gateway-secrets a REDIS_URL of a
    cluster or of Sentinel (TLS, the CA the pods mount); the patched Secret is still a valid one."""
    import kubernetes_validate
    from core.urls import parse_redis
    comp = yaml.safe_load((K8S / option / "kustomization.yaml").read_text())
    assert comp["kind"] == "Component" and comp["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    [patch] = comp["patches"]
    assert patch["target"] == {"kind": "Secret", "name": "gateway-secrets"}
    change = yaml.safe_load(patch["patch"])
    secret = get(objects, "Secret", "gateway-secrets")
    patched = {**secret, "stringData": {**secret["stringData"], **change["stringData"]}}
    kubernetes_validate.validate(patched, "1.29.0", strict=True)
    t = parse_redis(patched["stringData"]["REDIS_URL"])
    assert getattr(t, shape) and len(t.seeds) == 3 and t.tls is not None
    assert t.tls.ca_certs == "/etc/gateway-certs/redis-ca.pem"
    assert set(change["stringData"]) == {"REDIS_URL"}
