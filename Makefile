# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

CHROMIUM := /usr/bin/chromium

.PHONY: run test install clean browser services prometheus compose bench litellm-env node-clients messages screenshots

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
# xds-protos carries older copies of opentelemetry-proto's files and pip installs it last: put
# opentelemetry-proto's back (pyproject.toml says why they are the ones to keep)
	$(PY) -m pip install --quiet --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(PY) -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(STAMP)

install: $(STAMP)

# Development mode: the console's mail capture page and sandbox payments (loopback only).
run: $(STAMP)
	GATEWAY_DEV=1 $(VENV)/bin/gateway up

# The console's browser tests drive Debian's chromium: installed here when missing and apt-get can
# (as root, or with password-less sudo); otherwise those tests are skipped and say why, and under CI=true
# that skip fails the run (tests/conftest.py).
browser:
	@if [ ! -x $(CHROMIUM) ] && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  echo "installing Debian's chromium for the console's browser tests"; \
	  ( $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ) \
	    || echo "chromium could not be installed: the browser tests will be skipped (a failure under CI=true)"; \
	fi

# The production-shaped services tests (tests/test_production_services_e2e.py) run Debian's redis-server
# (ACL user, TLS) and PostgreSQL 15 (SCRAM, TLS), the Redis Cluster and Sentinel tests
# (tests/test_redis_cluster_e2e.py, tests/test_redis_sentinel_e2e.py) redis-server, redis-server --sentinel
# and redis-cli (redis-tools, which redis-server brings): installed here when missing and apt-get can (as root,
# or with password-less sudo); otherwise those tests are skipped and say why, and fail under CI=true.
REDIS_SERVER := /usr/bin/redis-server
PG_INITDB    := /usr/lib/postgresql/15/bin/initdb
services:
	@missing=""; [ -x $(REDIS_SERVER) ] || missing=" redis-server"; \
	[ -x $(PG_INITDB) ] || missing="$$missing postgresql-15"; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  echo "installing Debian's$$missing for the production-shaped services tests"; \
	  ( $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
	      apt-get install -y -qq --no-install-recommends $$missing openssl >/dev/null ) \
	    || echo "$$missing could not be installed: the production-shaped services tests will be skipped"; \
	fi

# The dashboard's queries and the alert rules are checked by Debian's Prometheus and promtool
# (tests/test_prometheus_e2e.py): installed here when missing and apt-get can (as root, or with
# password-less sudo); otherwise those tests are skipped and say why, and fail under CI=true.
PROMETHEUS := /usr/bin/prometheus
prometheus:
	@if [ ! -x $(PROMETHEUS) ] && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  echo "installing Debian's prometheus for the dashboard and alert-rule tests"; \
	  ( $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
	      apt-get install -y -qq --no-install-recommends prometheus >/dev/null ) \
	    || echo "prometheus could not be installed: the dashboard and alert-rule tests will be skipped"; \
	fi

# compose.yaml is checked by Debian's docker-compose (`docker-compose config`: the compose schema, the
# required variables; tests/test_compose.py; no Docker daemon needed): installed here when missing and
# apt-get can (as root, or with password-less sudo); otherwise those tests are skipped and say why, and
# fail under CI=true.
DOCKER_COMPOSE := /usr/bin/docker-compose
compose:
	@if [ ! -x $(DOCKER_COMPOSE) ] && command -v apt-get >/dev/null 2>&1; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; \
	  echo "installing Debian's docker-compose for the compose.yaml tests"; \
	  ( $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends docker-compose >/dev/null ) \
	    || echo "docker-compose could not be installed: the compose.yaml tests will be skipped"; \
	fi

# LiteLLM's proxy, a real third-party model server for tests/test_litellm_upstream_e2e.py (and the
# benchmark's comparison peer), in its own environment bench/.venv-litellm (litellm pins an openai SDK
# of its own): installed once from PyPI (about 3 minutes here), a stamp check afterwards. When it cannot
# be installed that test is skipped and says why (and fails under CI=true).
litellm-env: $(STAMP)
	@$(PY) -m bench.litellm_env

# The Vercel AI SDK for docs/clients.md's snippet (tests/test_clients_e2e.py), from the npm registry into
# .venv/node-clients where node and npm are; otherwise that test is skipped and says why (and fails
# under CI=true).
NODE_CLIENTS := $(VENV)/node-clients
node-clients: $(STAMP)
	@if [ ! -d $(NODE_CLIENTS)/node_modules/@ai-sdk/openai ] && command -v npm >/dev/null 2>&1; then \
	  echo "installing the Vercel AI SDK (npm) for the client tests"; \
	  mkdir -p $(NODE_CLIENTS) && npm install --prefix $(NODE_CLIENTS) --silent --no-audit --no-fund \
	    ai@7.0.173 @ai-sdk/openai@4.0.118 >/dev/null \
	    || echo "the Vercel AI SDK could not be installed: its client test will be skipped"; \
	fi

# The suite runs on TEST_WORKERS pytest-xdist workers (most of a test's time is spent waiting on its stack's
# processes, so three keep two cores busy), each file's tests on one worker (--dist loadfile: a module's
# stack is started once); `make test TEST_WORKERS=0` runs it in one process (docs/testing.md).
TEST_WORKERS ?= 3
test: $(STAMP) browser services prometheus compose litellm-env node-clients
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

# make bench [QUICK=1] [SOAK=seconds] [PROFILE=1]: see BENCHMARKS.md (bench/run.py).
bench: $(STAMP)
	command -v wrk >/dev/null || (apt-get update && apt-get install -y wrk)
	command -v gcc >/dev/null || (apt-get update && apt-get install -y gcc)  # the long-stream cell's C programs
	$(PY) -m bench.run $(if $(QUICK),--quick) $(if $(SOAK),--soak $(SOAK)) $(if $(PROFILE),--profile)

# The console's texts: messages.pot extracted from the templates and the code, messages.po updated from it
# (new texts come untranslated or fuzzy: translate them; tests/test_console_i18n.py fails until done).
LOCALE := control/console/locale
messages: $(STAMP)
	$(VENV)/bin/pybabel extract -F control/console/babel.cfg --no-location --sort-output \
	  --project "LLM gateway console" -o $(LOCALE)/messages.pot control/console
	$(VENV)/bin/pybabel update -i $(LOCALE)/messages.pot -d $(LOCALE) -l pl --ignore-obsolete

# docs/screenshots/: the console in both languages at 1280 and 390 px (docs/screenshots.py).
screenshots: $(STAMP) browser
	$(PY) docs/screenshots.py

clean:
	rm -rf .gateway .pytest_cache
