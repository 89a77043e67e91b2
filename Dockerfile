# syntax=docker/dockerfile:1
# The sidecar image for Kubernetes (helm/kafka-delay-sidecar). It runs against an existing Kafka:
# set bootstrap-servers (config file, DELAY_SIDECAR_BOOTSTRAP_SERVERS or KAFKA_BOOTSTRAP_SERVERS).
# There is no Java in the image, so the embedded development broker is not available here.
#
#   docker build -t ghcr.io/kafka-delay-sidecar/kafka-delay-sidecar:0.1.0 .
#   docker run --rm -e KAFKA_BOOTSTRAP_SERVERS=host:9092 -p 8080:8080 \
#     ghcr.io/kafka-delay-sidecar/kafka-delay-sidecar:0.1.0

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: wheels for the project and every dependency --------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# gcc for the C accelerator (sidecar/native/); the runtime image gets only the built wheel.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY sidecar ./sidecar
RUN pip wheel --wheel-dir /wheels . \
 && python -c "import sys, zipfile, glob; w = glob.glob('/wheels/kafka_delay_sidecar-*.whl')[0]; \
sys.exit(0 if any(n.startswith('sidecar/_native.') and n.endswith('.so') for n in zipfile.ZipFile(w).namelist()) \
else 'the wheel has no sidecar._native')"

# ---- runtime ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv "$VIRTUAL_ENV" \
 && pip install --no-cache-dir --no-index --find-links /wheels kafka-delay-sidecar \
 && groupadd --system --gid 10001 sidecar \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin sidecar \
 && mkdir -p /var/lib/delay-sidecar /etc/delay-sidecar \
 && chown 10001:10001 /var/lib/delay-sidecar \
 && printf '%s\n' \
      '# Image defaults; in Kubernetes the chart mounts its own config.yaml over this directory.' \
      'data-dir: /var/lib/delay-sidecar' \
      'http-host: 0.0.0.0' \
      'http-port: 8080' \
      > /etc/delay-sidecar/config.yaml

WORKDIR /var/lib/delay-sidecar
USER 10001:10001
EXPOSE 8080
VOLUME ["/var/lib/delay-sidecar"]
ENTRYPOINT ["delay-sidecar"]
CMD ["run", "--config", "/etc/delay-sidecar/config.yaml"]
