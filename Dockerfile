# syntax=docker/dockerfile:1
# The Walras operator image (walras run: operator + scheduler extender + metrics), referenced by the Helm chart's
# default values (image.repository "walras", tag = the chart's appVersion). Build from the repository root:
#   docker build -t walras:0.1.0 .
# Two stages: the build stage installs the project into a virtual environment (the operator plans on the CPU, on
# numpy, and never imports torch, so the default image has no torch; --build-arg WITH_TORCH=true adds the pinned CPU
# wheel, first and explicitly so that nothing pulls a CUDA build, for `walras solve --distributed` in the image);
# the runtime stage copies only that environment into a slim base and runs as an unprivileged user with a read-only
# root filesystem in mind (writes go to /tmp only).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG WITH_TORCH=false
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/walras
ENV PATH=/opt/walras/bin:$PATH
RUN if [ "${WITH_TORCH}" = true ]; then pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"; fi
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY allocator ./allocator
COPY operator ./operator
COPY crds ./crds
RUN pip install . && python -c "import walras" \
    && if [ "${WITH_TORCH}" = true ]; then \
         python -c "import torch; assert torch.__version__.startswith('${TORCH_VERSION}')"; fi
# Every numba kernel (price discovery, degree (SEQ), colocation, fairness) compiled ahead of time (numba pycc, generic
# x86-64 code) into the installed package, so that a fresh pod neither imports numba nor compiles for its first plan
# (the route tables allocator/pricing/_compiled/kernels.py, allocator/degree/kernels.py, allocator/colocation/kernels.py
# and allocator/fairness/kernels.py, route "aot"); gcc is needed for this step only and stays in the build stage. The checks fail the build when a module does not load or was built from another kernel
# source. They run from / so that `allocator` is the installed package (the runtime stage copies /opt/walras only),
# not the source tree in the working directory /src.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && cd / \
    && python -m allocator.pricing._compiled.aot \
    && python -m allocator.degree.aot \
    && python -m allocator.colocation.aot \
    && python -m allocator.fairness.aot \
    && python -c "from allocator.pricing._compiled import kernels; k = kernels.load(); assert k.route == 'aot', k.route" \
    && python -c "from allocator.degree import kernels; k = kernels.load(); assert k.route == 'aot', k.route" \
    && python -c "from allocator.colocation import kernels; k = kernels.load(); assert k.route == 'aot', k.route" \
    && python -c "from allocator.fairness import kernels; k = kernels.load(); assert k.route == 'aot', k.route"

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="walras" \
      org.opencontainers.image.description="Walras: a market for heterogeneous Kubernetes clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 walras \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin walras
COPY --from=build /opt/walras /opt/walras
# numba keeps the just-in-time kernels of allocator (colocation DP, fairness fills; the pricing and degree kernels
# are compiled ahead of time above) in NUMBA_CACHE_DIR: the root filesystem is read-only, /tmp is the chart's
# writable emptyDir (without a writable cache directory the kernels compile once per process instead, see
# allocator/_jit.py).
ENV PATH=/opt/walras/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    NUMBA_CACHE_DIR=/tmp/numba-cache
USER 10001:10001
# extender, metrics, kopf health
EXPOSE 8888 9847 8080
ENTRYPOINT ["walras"]
CMD ["run"]
