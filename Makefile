# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

CHROMIUM := /usr/bin/chromium

.PHONY: run test install clean browser bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/gateway up

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

test: $(STAMP) browser
	$(PY) -m pytest -q -p no:cacheprovider

# make bench [QUICK=1] [SOAK=seconds] [PROFILE=1]: see BENCHMARKS.md (bench/run.py).
bench: $(STAMP)
	command -v wrk >/dev/null || (apt-get update && apt-get install -y wrk)
	$(PY) -m bench.run $(if $(QUICK),--quick) $(if $(SOAK),--soak $(SOAK)) $(if $(PROFILE),--profile)

clean:
	rm -rf .gateway .pytest_cache
