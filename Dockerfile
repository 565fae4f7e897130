# throughline serve: the projector and the HTTP read API in one process (docs/http.md).
#
#   docker build -t throughline .
#   docker run --rm -e THROUGHLINE_BOOTSTRAP_SERVERS=host:9092 -e THROUGHLINE_AUTH_TOKEN=... \
#       -p 127.0.0.1:8787:8787 -v throughline-data:/var/lib/throughline throughline
#
# In a container the API binds 0.0.0.0 (the default CMD), so a bearer token is required: serve refuses
# to start without THROUGHLINE_AUTH_TOKEN (or --auth-token-file). compose.yaml wires it to Kafka.
# Plain HTTP beyond loopback also needs --insecure-http (docs/security.md): the default CMD says so,
# because the container's port is published on the host's loopback or behind a TLS proxy; to serve
# HTTPS from the container itself, run `serve --host 0.0.0.0 --tls-cert F --tls-key F` instead.
#
# The base is the official python:3.11-slim image. Where it cannot be pulled (no registry), build on the
# local Debian one that scripts/docker-images makes (images/python/Dockerfile):
#   docker build --build-arg PYTHON_IMAGE=throughline-python:3.11-bookworm -t throughline:local .
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The package goes into its own virtualenv: the same on the official image and on Debian's Python, whose
# system interpreter refuses `pip install` into itself (PEP 668).
ENV PATH=/opt/throughline/bin:$PATH
# Only what the package is built from (see pyproject.toml's package-dir): the image holds no tests,
# no virtualenv and no cache from the build context.
COPY pyproject.toml README.md ./
COPY throughline ./throughline
COPY producers ./producers
COPY projector ./projector
COPY reader ./reader
COPY schemas ./schemas
RUN python3 -m venv /opt/throughline \
 && /opt/throughline/bin/pip install . \
 && rm -rf /src \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/throughline throughline \
 && mkdir -p /var/lib/throughline \
 && chown throughline:throughline /var/lib/throughline

USER throughline
WORKDIR /var/lib/throughline
# The projection and its page-token key (created beside it on first start) live on this volume, so a
# restarted container keeps both; a lost volume is rebuilt from the log, but old page tokens die.
VOLUME ["/var/lib/throughline"]
ENV THROUGHLINE_DB=/var/lib/throughline/throughline.duckdb
EXPOSE 8787
# SIGTERM (docker stop) finishes requests and the projector's batch in flight, then exits 0.
STOPSIGNAL SIGTERM

ENTRYPOINT ["throughline"]
CMD ["serve", "--host", "0.0.0.0", "--insecure-http"]
