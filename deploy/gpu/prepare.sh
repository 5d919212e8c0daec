#!/usr/bin/env bash
# Prepare the one device call that runs `make gpu-check` on a lent GPU machine (issue 46; docs/benchmarks.md, "GPU"):
# the wheels its image lacks, into .whl/ (ignored by git; the call carries it), then print that call.
#   make gpu-prepare            # or: deploy/gpu/prepare.sh [--no-suite]   (--no-suite: only what psrv needs)
# The machine (/work/.library/device/KINDS.md, nvidia-h200): x86-64, python3 3.12 with torch (CUDA), msgpack,
# prometheus-client, numpy, scipy, matplotlib, scikit-learn, tqdm, rich, tensorboard, pyyaml, pytest, pytest-xdist,
# pytest-timeout and hypothesis; no pyzmq, no orjson, no mnist1d; none of the test suite's import-linter and kubernetes-validate.
# Nothing there can be downloaded. psrv itself is installed there from the carried working tree, editable (pip -e .,
# its build backend from .whl/build): the tests import psrv.workers and psrv.experiments from the tree, as here.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
DEST=.whl
PSRV_NEEDS="pyzmq==27.3.0 orjson==3.13.0 mnist1d==0.0.2.post1"   # the versions this project's CI installs
SUITE_NEEDS="import-linter==2.17 grimp==3.20 kubernetes-validate==1.37.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 importlib-resources==7.1.0"
BUILD_NEEDS="setuptools==84.2.1"  # pyproject's build backend, for pip's isolated build of psrv there (into .whl/build)
[ "${1:-}" = "--no-suite" ] && SUITE_NEEDS=""
git check-ignore -q "$DEST/x.whl" || { echo "$DEST/ is not ignored by git here: add it to .gitignore" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" $PSRV_NEEDS $SUITE_NEEDS
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DEST/build" $BUILD_NEEDS
for w in "$DEST"/*.whl "$DEST"/build/*.whl; do  # pure Python, or CPython 3.12 (or the stable ABI) for x86-64 manylinux
  case "$(basename "$w")" in
    *-py3-none-any.whl|*-cp312-cp312-*manylinux*x86_64*.whl|*-cp312-abi3-*manylinux*x86_64*.whl) ;;
    *) echo "$w: not a wheel for CPython 3.12 on x86-64 Linux" >&2; exit 1 ;;
  esac
done
ls -1 "$DEST"/*.whl "$DEST"/build/*.whl
echo "$(du -sh "$DEST" | cut -f1) in $DEST (the call carries at most 64 MiB with the working tree)"
cat <<'CALL'

The one device call (run tool), from this checkout, right after committing what it should measure:
  carry: [".whl"]     timeout_s: 600
  command:
export PYTHONUNBUFFERED=1; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl && python3 -m pip install -q --no-index --no-deps --find-links .whl/build -e . || exit 1; nvidia-smi -L; set -o pipefail; python3 -m psrv.experiments.bench.gpu_check --out $OUT/gpu --budget 540 2>&1 | tee $OUT/gpu-check.log

Then copy what came back (results.json, results.md, pytest-gpu.txt, pytest-suite.txt, gpu-check.log) into the
repository and the GPU section of docs/benchmarks.md. --budget 540 spends the call on one try: a smaller one (e.g.
--budget 300 --parts tests apply copies samples) leaves device time to run it again.
CALL
