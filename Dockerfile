# One image for the master and the workers (README: "Containers and Kubernetes").
#   docker build -t a3c-http:0.1.0 .
#   docker build --build-arg EXTRAS=atari,minatar -t a3c-http:0.1.0-atari .
# It runs the master by default; a worker is the same image with the command `a3c-worker ...`.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The build stage installs into a virtual environment that the runtime stage copies whole, so
# the sources, pip and its build tools stay out of the image the services run in.
FROM ${PYTHON_IMAGE} AS build
# PyTorch's index of CPU builds: the torch of PyPI brings gigabytes of CUDA packages.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# The torch of scripts/constraints.txt (tests/ops/test_deploy.py keeps them equal).
ARG TORCH_VERSION=2.13.0
# Optional extras of pyproject.toml, comma-separated (atari, minatar, box2d, tensorboard, wandb).
ARG EXTRAS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY scripts/constraints.txt scripts/constraints.txt
# torch on its own layer, which code changes do not rebuild.
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY a3c_http a3c_http
COPY master master
COPY worker worker
RUN pip install --no-cache-dir -c scripts/constraints.txt ".${EXTRAS:+[$EXTRAS]}"

FROM ${PYTHON_IMAGE}
# A numeric user, so that Kubernetes' runAsNonRoot can check it (it cannot check a name).
RUN groupadd --gid 10001 a3c \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --shell /usr/sbin/nologin a3c \
    && mkdir /data \
    && chown 10001:10001 /data
COPY --from=build /opt/venv /opt/venv
COPY --chmod=755 deploy/healthcheck.py /usr/local/bin/a3c-healthcheck
# /data: mount a volume there for the master; its run folder is A3C_RUN_DIR, a folder of it (a
# fresh filesystem's lost+found stays out of the run folder). A named volume starts out owned
# by the image's /data, that is by a3c.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    A3C_RUN_DIR=/data/run
WORKDIR /data
USER 10001:10001
# a3c-master's port and a3c-worker's.
EXPOSE 33333 8001
# GET /healthz on whichever of the two ports answers (`a3c-healthcheck PORT` for another port).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 CMD ["a3c-healthcheck"]
CMD ["a3c-master", "--host", "0.0.0.0", "--port", "33333"]
