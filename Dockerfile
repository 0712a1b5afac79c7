# meshplan operator image.
#
# Two stages: `build` turns the source tree into a wheel; the final stage installs
# that wheel (and only its runtime dependencies) into a venv, with no compiler,
# no pip cache and no source tree. Runs as the unprivileged uid/gid 10001, which
# the Helm chart's securityContext also names (charts/meshplan/templates/_helpers.tpl).
#
#   docker build -t meshplan:0.1.0 .
#   docker run --rm meshplan:0.1.0 --help
#
# The base image tag is exact (Python 3.11 = pyproject requires-python >=3.11);
# pin its digest too when you build for production:
#   docker buildx imagetools inspect python:3.11.13-slim-bookworm
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/meshplan \
    PATH=/opt/meshplan/bin:$PATH \
    USER=meshplan HOME=/tmp
COPY --from=build /wheels /wheels
RUN python -m venv /opt/meshplan \
    && /opt/meshplan/bin/pip install /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 meshplan \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin meshplan
USER 10001:10001
# 8080: /metrics (MESHPLAN_METRICS_PORT); 8081: kopf liveness (--liveness).
EXPOSE 8080 8081
ENTRYPOINT ["meshplan"]
CMD ["run"]
