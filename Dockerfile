# bastion images. Two targets:
#   bastion  the daemon: ENTRYPOINT ["bastion"], CMD ["start"], user `bastion` (uid 10001),
#            ROOT from $BASTION_ROOT (docker run -e BASTION_ROOT=gs://bucket/root IMAGE).
#   worker   the agent plus Python, the base for users' images (`python3 -m bastion.agent`).
#
# Online (the default): docker build --target=bastion -t bastion .
#   BASE defaults to python:3.11-slim; pip installs this package and its dependencies from PyPI.
#
# Offline (the tests; no Docker Hub, no PyPI from inside the build): give a local Debian-based
# base with python3 (it may have neither pip nor venv) and put wheels of the dependencies plus
# pip, setuptools and wheel into a `wheels/` directory of the build context, made on the host:
#   pip wheel -w wheels/ pip setuptools wheel <the [project] dependencies of pyproject.toml>
#   docker build --build-arg BASE=bastion-test/python:3.11 --target=bastion -t bastion .
# When wheels/ is there, pip runs --no-index --find-links=/wheels; a base without pip runs pip
# straight from its wheel (`python3 /wheels/pip-*.whl/pip`, which pip supports). Packages go to
# /opt/bastion/deps and /opt/bastion/app with `pip install --target` (no venv module needed),
# put on sys.path by a .pth file, with the `bastion` script on PATH. The dependencies are one
# layer keyed on pyproject.toml and wheels/, so editing the code rebuilds only the package layer.
# The legacy builder is enough (no RUN --mount, no BuildKit syntax).

ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
# pyproject.toml always matches, so this COPY works with or without a wheels/ directory.
COPY pyproject.toml wheel[s] /wheels/
RUN set -eu; \
    if ls /wheels/*.whl >/dev/null 2>&1; then \
        SRC="--no-index --find-links=/wheels"; \
    else SRC=""; fi; \
    if python3 -m pip --version >/dev/null 2>&1; then PIP="python3 -m pip"; \
    else PIP="python3 $(ls /wheels/pip-*.whl | head -n1)/pip"; fi; \
    printf '%s\n' "$SRC" >/pip-source; \
    $PIP install -q $SRC --target=/opt/build-tools pip setuptools wheel; \
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/wheels/pyproject.toml", "rb"))["project"]["dependencies"]))' >/requirements.txt; \
    $PIP install -q $SRC --target=/opt/bastion/deps -r /requirements.txt
COPY . /src
# Build tools from the layer above (no isolated build env to set up: a code change costs seconds).
RUN set -eu; rm -rf /src/wheels; \
    PYTHONPATH=/opt/build-tools python3 -m pip install -q $(cat /pip-source) \
        --no-build-isolation --no-deps --target=/opt/bastion/app /src

FROM ${BASE} AS runtime
ENV PATH=/opt/bastion/app/bin:/opt/bastion/deps/bin:$PATH PYTHONUNBUFFERED=1 LANG=C.UTF-8
# A .pth file, not PYTHONPATH: the packages come after site-packages on sys.path, so what a
# user's image pip-installs on top of `worker` wins over bastion's copies.
RUN python3 -c 'import os, site; d = site.getsitepackages()[0]; os.makedirs(d, exist_ok=True); open(os.path.join(d, "bastion.pth"), "w").write("/opt/bastion/app\n/opt/bastion/deps\n")'
COPY --from=build /opt/bastion /opt/bastion

FROM runtime AS worker
RUN python3 -c 'import bastion.agent'
WORKDIR /workspace
CMD ["python3"]

FROM runtime AS bastion
RUN set -eu; \
    if command -v useradd >/dev/null 2>&1; then \
        useradd --system --uid 10001 --user-group --create-home --home-dir /home/bastion bastion; \
    else \
        echo 'bastion:x:10001:10001::/home/bastion:/bin/sh' >>/etc/passwd; \
        echo 'bastion:x:10001:' >>/etc/group; mkdir -p /home/bastion; \
        chown 10001:10001 /home/bastion; \
    fi; \
    mkdir -p /data && chown 10001:10001 /data
USER 10001:10001
ENV HOME=/home/bastion BASTION_ROOT=/data/root
WORKDIR /home/bastion
ENTRYPOINT ["bastion"]
CMD ["start"]
