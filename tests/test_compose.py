"""compose.yaml and the Dockerfile agree with the code (no Docker needed: the YAML is only parsed).

Settings names and ports come from control/settings.py, the simulators from control/catalog.yaml, and
the Envoy config that the image's entrypoint renders is rendered here with compose's environment.
"""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from core import catalog as catalog_mod
from control.settings import ENV_VARS, Settings
from sim.cli import _parser as sim_parser

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
ENTRYPOINT = ROOT / "deploy" / "docker" / "entrypoint.py"
CATALOG = ROOT / "control" / "catalog.yaml"
PROJECT_SERVICES = ("migrate", "envoy", "extproc", "usage-writer", "console")
LOOPBACK = ("127.0.0.1", "localhost")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), "compose.yaml has no services"
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        out = {}
        for item in env:
            k, _, v = str(item).partition("=")
            out[k] = v
        return out
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def argv_of(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, **overrides: object) -> Settings:
    for name in ENV_VARS.values():
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return Settings.from_env(**overrides)


def is_project_image(svc: dict[str, Any]) -> bool:
    return "build" in svc


def sim_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if argv_of(s)[:3] == ["python", "-m", "sim"]}


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


# ---- services and images -----------------------------------------------------------------------

def test_services_present(services: dict[str, dict[str, Any]]) -> None:
    for name in ("postgres", "redis", "migrate", "envoy", "extproc", "usage-writer", "console"):
        assert name in services, f"compose.yaml lacks the {name} service"
    assert sim_services(services), "compose.yaml runs no simulator"
    assert services["postgres"]["image"] == "postgres:18"
    assert services["redis"]["image"] == "redis:7"


def test_project_services_build_this_repo(services: dict[str, dict[str, Any]]) -> None:
    project = [n for n in services if n not in ("postgres", "redis")]
    images = set()
    for name in project:
        svc = services[name]
        assert is_project_image(svc), f"{name} must run the project image (build: .)"
        build = svc["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert (ROOT / context / dockerfile).resolve() == DOCKERFILE, f"{name} builds {context}/{dockerfile}"
        images.add(svc.get("image"))
    assert DOCKERFILE.is_file()
    assert len(images) == 1, f"project services name different images: {images}"


def test_dockerfile_sources_exist() -> None:
    ins = dockerfile_instructions()
    assert ins[0] == ("FROM", "python:3.11-slim")
    copies = [rest.split() for op, rest in ins if op == "COPY"]
    assert copies
    for parts in copies:
        srcs = [p for p in parts[:-1] if not p.startswith("--")]
        for src in srcs:
            assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
    copied = {src for parts in copies for src in parts[:-1]}
    for needed in ("pyproject.toml", "extproc", "control", "sim", "envoy"):
        assert any(c.rstrip("/") == needed for c in copied), f"Dockerfile does not copy {needed}"
    assert any(op == "RUN" and re.search(r"pip install (\S+ )*\.(\s|$)", rest) for op, rest in ins), \
        "Dockerfile does not pip install the project"
    entry = [rest for op, rest in ins if op == "ENTRYPOINT"]
    assert entry and str(ENTRYPOINT.relative_to(ROOT)) in entry[-1]


def test_catalog_path_exists_in_image(services: dict[str, dict[str, Any]]) -> None:
    """GATEWAY_CATALOG names a file that the Dockerfile copies from the repository."""
    ins = dockerfile_instructions()
    workdir = [rest for op, rest in ins if op == "WORKDIR"][-1]
    for name, svc in services.items():
        path = env_of(svc).get("GATEWAY_CATALOG")
        if path is None:
            continue
        assert path.startswith(workdir.rstrip("/") + "/"), f"{name}: catalog {path} outside {workdir}"
        assert (ROOT / path[len(workdir.rstrip("/")) + 1:]).is_file(), f"{name}: {path} not in the image"


# ---- settings ----------------------------------------------------------------------------------

def test_env_var_names_are_settings(services: dict[str, dict[str, Any]]) -> None:
    known = set(ENV_VARS.values())
    used = {(n, k) for n, s in services.items() for k in env_of(s)
            if k.startswith("GATEWAY_") or k in ("DATABASE_URL", "REDIS_URL")}
    assert used
    unknown = sorted(f"{n}: {k}" for n, k in used if k not in known)
    assert not unknown, f"compose.yaml sets variables that control/settings.py does not read: {unknown}"


def test_services_reach_postgres_and_redis(services: dict[str, dict[str, Any]]) -> None:
    pg_env = env_of(services["postgres"])
    for name in ("migrate", "extproc", "usage-writer", "console"):
        env = env_of(services[name])
        db = env.get("DATABASE_URL", "")
        assert db.startswith("postgresql://") and "@postgres:5432/" in db, f"{name}: DATABASE_URL {db!r}"
        assert db.rsplit("/", 1)[1] == pg_env["POSTGRES_DB"]
        assert db.split("//", 1)[1].split(":", 1)[0] == pg_env["POSTGRES_USER"]
    for name in ("extproc", "usage-writer", "console"):  # with the password Redis requires
        assert env_of(services[name]).get("REDIS_URL", "") == "redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD (in .env)}@redis:6379/0"


def test_published_gateway_port(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    default = Settings().gateway_port
    published = []
    for name, svc in services.items():
        for p in svc.get("ports") or []:
            published.append((name, str(p)))
    console = Settings(gateway_port=default).console_http_port
    assert published == [("envoy", f"{default}:{default}"), ("console", f"{console}:{console}")], published
    s = settings_from(env_of(services["envoy"]), monkeypatch)
    assert s.gateway_port == default
    assert s.gateway_host == "0.0.0.0", "Envoy must listen on all interfaces to be reachable via the port"


def test_envoy_and_extproc_agree(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    envoy = settings_from(env_of(services["envoy"]), monkeypatch)
    extproc = settings_from(env_of(services["extproc"]), monkeypatch)
    assert envoy.grpc_port == extproc.grpc_port
    assert envoy.catalog == extproc.catalog
    hc = " ".join(services["envoy"]["healthcheck"]["test"])
    assert f":{envoy.envoy_admin_port}/ready" in hc
    hc = " ".join(services["extproc"]["healthcheck"]["test"])
    assert str(extproc.grpc_port) in hc


def test_stopping_drains_as_gateway_up_does(services: dict[str, dict[str, Any]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """compose stops the ext_proc before Envoy (it shares Envoy's network): the ext_proc drains that Envoy
    first; both are given the drain's budget, which covers a stream's whole upstream budget, and more."""
    extproc = settings_from(env_of(services["extproc"]), monkeypatch)
    assert extproc.drain_envoy_on_stop and extproc.drain_grace_s >= extproc.total_timeout_s
    for name in ("envoy", "extproc"):
        grace = services[name]["stop_grace_period"]
        assert grace.endswith("s") and int(grace[:-1]) >= extproc.drain_grace_s + 20, name


def test_loopback_services_share_envoys_network(services: dict[str, dict[str, Any]]) -> None:
    """ext_proc binds 127.0.0.1 and the catalog's deployments are loopback: same namespace as Envoy."""
    for name in ["extproc", *sim_services(services)]:
        assert services[name].get("network_mode") == "service:envoy", name
        assert not services[name].get("ports"), f"{name} cannot publish ports in envoy's namespace"


def test_redis_is_durable(services: dict[str, dict[str, Any]]) -> None:
    argv = argv_of(services["redis"])
    assert argv[0] == "redis-server"
    opts = dict(zip(argv[1::2], argv[2::2]))
    assert opts.get("--appendonly") == "yes"
    assert opts.get("--appendfsync") == "everysec"
    assert opts.get("--requirepass") == "${REDIS_PASSWORD:?set REDIS_PASSWORD (in .env)}", "Redis without a password"
    assert any(v.split(":")[1] == "/data" for v in services["redis"]["volumes"])


def test_postgres_volume_layout(services: dict[str, dict[str, Any]]) -> None:
    # postgres:18 images keep PGDATA in a versioned directory under /var/lib/postgresql.
    mounts = [v.split(":")[1] for v in services["postgres"]["volumes"]]
    assert "/var/lib/postgresql" in mounts


def test_migrate_runs_first(services: dict[str, dict[str, Any]]) -> None:
    assert argv_of(services["migrate"]) == ["migrate"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("extproc", "usage-writer", "console"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"


def test_usage_writer_runs_and_is_checked_on_its_metrics_port(services: dict[str, dict[str, Any]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    svc = services["usage-writer"]
    assert argv_of(svc) == ["python", "-m", "extproc.usage_writer"]
    s = settings_from(env_of(svc), monkeypatch)
    assert f"'127.0.0.1', {s.writer_metrics_http_port})" in " ".join(svc["healthcheck"]["test"])
    assert svc["restart"] == "unless-stopped" and not svc.get("ports")


# ---- simulators match the catalog --------------------------------------------------------------

def expected_sims() -> dict[tuple[str, int], dict[str, Any]]:
    """Like control.launcher.Stack._sim_procs: one simulator per loopback (name, port)."""
    cat = catalog_mod.load(str(CATALOG))
    kinds: dict[str, str] = {}
    for a in cat.aliases.values():
        for u in a.upstreams:
            kinds[u.model] = "embed" if "embeddings" in a.capabilities else "chat"
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for model, deps in cat.deployments.items():
        for d in deps:
            if d.host not in LOOPBACK:
                continue
            ctx = max((a.context_length for a in cat.aliases.values()
                       if any(u.model == model for u in a.upstreams)), default=8192)
            entry = out.setdefault((d.name, d.port_at(Settings().gateway_port)), {"chat": {}, "embed": {}})
            entry[kinds.get(model, "chat")][model] = ctx
    return out


def test_sims_match_catalog(services: dict[str, dict[str, Any]]) -> None:
    expected = expected_sims()
    assert expected, "the demo catalog has no loopback deployments"
    got: dict[tuple[str, int], dict[str, Any]] = {}
    for name, svc in sim_services(services).items():
        args = sim_parser().parse_args(argv_of(svc)[3:])
        assert args.host in LOOPBACK, f"{name} listens on {args.host}"
        key = (args.name, args.port)
        assert key not in got, f"two simulators for {key}"
        got[key] = {"chat": dict(args.chat_model), "embed": dict(args.embed_model)}
        hc = " ".join(svc["healthcheck"]["test"])
        assert f"127.0.0.1:{args.port}/health" in hc, name
    assert got == expected


# ---- what the image's entrypoint renders with compose's environment -----------------------------

def test_entrypoint_renders_envoy(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path) -> None:
    from control.envoy_config import write_config  # what the entrypoint's envoy runner renders first
    env = env_of(services["envoy"])
    assert argv_of(services["envoy"])[0] == "envoy"
    s = settings_from(env, monkeypatch, state_dir=str(tmp_path), catalog=str(CATALOG))
    boot = yaml.safe_load(write_config(s).read_text())
    listener = boot["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert (listener["address"], listener["port_value"]) == ("0.0.0.0", Settings().gateway_port)
    [xp] = [c for c in boot["static_resources"]["clusters"] if c["name"] == "extproc"]
    ep_addr = xp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    extproc = settings_from(env_of(services["extproc"]), monkeypatch)
    assert (ep_addr["address"], ep_addr["port_value"]) == ("127.0.0.1", extproc.grpc_port)
    assert boot["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    cds = yaml.safe_load((tmp_path / "envoy" / "cds.yaml").read_text())
    upstream_ports = {e["endpoint"]["address"]["socket_address"]["port_value"]
                      for c in cds["resources"]
                      for group in c["load_assignment"]["endpoints"] for e in group["lb_endpoints"]}
    assert upstream_ports == {port for _, port in expected_sims()}


# ---- what docker compose makes of it (Debian's docker-compose: `make compose`) ------------------------

DOCKER_COMPOSE = Path("/usr/bin/docker-compose")
REQUIRED = {"POSTGRES_PASSWORD": "pg-s3cret", "REDIS_PASSWORD": "redis-s3cret",
            "GATEWAY_CONSOLE_URL": "https://console.example.com", "GATEWAY_CONSOLE_SECRET": "c" * 64,
            "GATEWAY_SMTP_HOST": "smtp.example.com", "GATEWAY_MAIL_FROM": "console@example.com",
            "GATEWAY_P24_MERCHANT_ID": "12345", "GATEWAY_P24_CRC": "crc", "GATEWAY_P24_API_KEY": "api"}


def compose_config(env: dict[str, str], tmp_path: Path, text: str | None = None) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` (validation against the compose schema, then interpolation) of compose.yaml,
    or of ``text`` in its place, with exactly ``env`` (no .env file: a clean directory)."""
    if not DOCKER_COMPOSE.exists():
        pytest.skip(f"{DOCKER_COMPOSE} is missing (Debian's docker-compose; `make compose`, which `make test` runs, "
                    "installs it where apt-get is available)")
    f = tmp_path / "compose.yaml"
    f.write_text(COMPOSE.read_text() if text is None else text)
    (tmp_path / "Dockerfile").write_text(DOCKERFILE.read_text())  # in the build context the file names
    return subprocess.run([str(DOCKER_COMPOSE), "-f", str(f), "--project-directory", str(tmp_path), "config"],
                          env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def test_compose_validates_and_the_console_passes_its_production_checks(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from control.console.launch import refusal
    done = compose_config(REQUIRED, tmp_path)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)["services"]
    console = settings_from({k: str(v) for k, v in resolved["console"]["environment"].items()}, monkeypatch)
    assert refusal(console) is None and not console.dev
    assert console.console_url == "https://console.example.com" and console.smtp_tls == "starttls"
    for name in ("migrate", "extproc", "usage-writer", "console"):
        env = resolved[name]["environment"]
        assert env["DATABASE_URL"] == "postgresql://gateway:pg-s3cret@postgres:5432/gateway", name
    for name in ("extproc", "usage-writer", "console"):
        assert resolved[name]["environment"]["REDIS_URL"] == "redis://:redis-s3cret@redis:6379/0", name
    assert resolved["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pg-s3cret"
    argv = resolved["redis"]["command"]
    assert argv[argv.index("--requirepass") + 1] == "redis-s3cret"
    assert resolved["redis"]["environment"]["REDISCLI_AUTH"] == "redis-s3cret"  # the health check logs in
    hc = " ".join(resolved["console"]["healthcheck"]["test"])
    assert f"127.0.0.1:{console.console_http_port}/healthz" in hc


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_every_secret_is_required(missing: str, tmp_path: Path) -> None:
    """No password or secret has a default: without one compose stops with the variable's message."""
    done = compose_config({k: v for k, v in REQUIRED.items() if k != missing}, tmp_path)
    assert done.returncode != 0 and f"set {missing}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_compose_schema_check_catches_a_misspelt_field(tmp_path: Path) -> None:
    done = compose_config(REQUIRED, tmp_path, COMPOSE.read_text().replace("    healthcheck:", "    healtcheck:", 1))
    assert done.returncode != 0 and "healtcheck" in done.stderr, done.stderr


def test_every_healthcheck_times_out_before_the_next_one(services: dict[str, dict[str, Any]]) -> None:
    def seconds(d: str) -> float:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)s", d)
        assert m, d
        return float(m.group(1))
    checked = {name: svc["healthcheck"] for name, svc in services.items() if "healthcheck" in svc}
    assert {"postgres", "redis", "envoy", "extproc"} <= set(checked), sorted(checked)
    for name, hc in checked.items():
        assert seconds(hc["timeout"]) < seconds(hc["interval"]), (name, hc)


def test_the_redis_cluster_option_validates_and_every_process_names_the_cluster(tmp_path: Path) -> None:
    """compose.redis-cluster.yaml over compose.yaml: six durable cluster nodes with the password, the
    `redis` service forming the cluster and healthy once it is, and every process's REDIS_URL the
    cluster's (read as the processes read it)."""
    from core.urls import parse_redis
    if not DOCKER_COMPOSE.exists():
        pytest.skip(f"{DOCKER_COMPOSE} is missing (Debian's docker-compose; `make compose` installs it)")
    for f in (COMPOSE, ROOT / "compose.redis-cluster.yaml", DOCKERFILE):
        (tmp_path / f.name).write_text(f.read_text())
    done = subprocess.run([str(DOCKER_COMPOSE), "-f", "compose.yaml", "-f", "compose.redis-cluster.yaml",
                           "--project-directory", str(tmp_path), "config"], env={"PATH": "/usr/bin:/bin", **REQUIRED},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    for name in ("envoy", "migrate", "extproc", "usage-writer", "console"):
        t = parse_redis(services[name]["environment"]["REDIS_URL"])
        assert t.cluster and t.password == "redis-s3cret", name
        assert {h for h, _ in t.seeds} <= {f"redis-{n}" for n in range(1, 7)}, name
    for n in range(1, 7):
        argv = services[f"redis-{n}"]["command"]
        for flag, value in [("--cluster-enabled", "yes"), ("--appendonly", "yes"), ("--maxmemory-policy", "noeviction"),
                            ("--requirepass", "redis-s3cret"), ("--masterauth", "redis-s3cret")]:
            assert argv[argv.index(flag) + 1] == value, (n, flag)
        assert services["redis"]["depends_on"][f"redis-{n}"]["condition"] == "service_healthy"
    former = " ".join(services["redis"]["command"])
    assert "--cluster create" in former and "--cluster-replicas 1" in former
    assert "cluster_state:ok" in " ".join(services["redis"]["healthcheck"]["test"])
    for name in ("extproc", "usage-writer", "console"):  # they wait for the cluster formed
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
