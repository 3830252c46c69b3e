# One image for every Periscope service; the entry point is the `periscope` command and the
# Kubernetes manifests pick the service with its first argument (probe, watch, join, api).
#
#   docker build -t periscope:0.1.0 .
#
# The builder stage installs the project into a virtual environment pinned by constraints.txt; the
# runtime stage copies only that environment onto a slim Python, so no compiler, pip cache or source
# tree ships in the image. Both stages use the same base so the venv's interpreter symlinks resolve.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv

WORKDIR /src

# Dependencies first, in their own layer: they change far less often than the code. The list comes
# from pyproject.toml itself so it cannot drift from the project metadata.
COPY pyproject.toml constraints.txt README.md ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(deps))" > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt

COPY periscope ./periscope
COPY services ./services
RUN pip install --no-deps -c constraints.txt . \
 && pip check \
 && cd / && python -c "import periscope.config, periscope.bus.topics, services"


FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="periscope" \
      org.opencontainers.image.description="GPU-to-pod attribution for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric UID/GID: Kubernetes can only enforce runAsNonRoot against a numeric USER.
RUN groupadd --system --gid 10001 periscope \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/periscope --no-create-home \
      --shell /usr/sbin/nologin periscope \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/periscope

COPY --from=builder /opt/venv /opt/venv

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# The joiner keeps its Faust table data under the working directory; mount a volume here when the
# root filesystem is read-only.
WORKDIR /var/lib/periscope

USER 10001:10001

ENTRYPOINT ["periscope"]
CMD ["--help"]
