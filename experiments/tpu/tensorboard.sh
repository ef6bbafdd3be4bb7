#!/usr/bin/env bash
# TensorBoard on a pod run: copy process 0's output directory from worker 0,
# then run TensorBoard on the copy here. See docs/tpu_pods.md.
set -euo pipefail

PROG=experiments/tpu/tensorboard.sh
# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() {
  cat <<EOF
Usage: $PROG --name NAME --zone ZONE [--run-name RUN] [--to DIR] [--port PORT] [--copy-only]

Process 0 of a pod run (worker 0) writes metrics.jsonl, TensorBoard events,
rollouts and plots to its local output.directory, ~/rljax/runs/RUN on worker
0 (launch_pod.sh sets it). This copies that directory here:

  gcloud compute tpus tpu-vm scp --recurse NAME:rljax/runs/RUN DIR --worker=0 --zone=ZONE

and runs 'tensorboard --logdir=DIR --port=PORT' on the copy (pip install
tensorboard). The copy is a snapshot: run this again to bring it up to date.
Without --run-name it copies every run in ~/rljax/runs, to compare them.

Required:
  --name NAME     the TPU VM
  --zone ZONE     its zone

Options:
  --project PROJECT  Google Cloud project (default: gcloud config)
  --run-name RUN     the run (launch_pod.sh's --run-name; default: all runs)
  --remote-dir DIR   the source directory on the workers (default: rljax)
  --to DIR           where the copy goes here (default: runs/NAME)
  --port PORT        default 6006
  --copy-only        copy, do not start TensorBoard (e.g. to keep the logs
                     before deleting the pod)
  --dry-run          print every command instead of running it
  -h, --help         show this help

Example:
  $PROG --name my-pod --zone us-west4-a --run-name grpo
EOF
}

NAME="" ZONE="" PROJECT="" RUN_NAME="" REMOTE_DIR="rljax" TO="" PORT=6006
COPY_ONLY=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --run-name) need_value "$@"; RUN_NAME=$2; shift 2 ;;
    --remote-dir) need_value "$@"; REMOTE_DIR=$2; shift 2 ;;
    --to) need_value "$@"; TO=$2; shift 2 ;;
    --port) need_value "$@"; PORT=$2; shift 2 ;;
    --copy-only) COPY_ONLY=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1'." ;;
  esac
done

require --name "$NAME"
require --zone "$ZONE"
check_name --name "$NAME"
check_zone "$ZONE"
check_remote_dir "$REMOTE_DIR"
check_run_name "$RUN_NAME"
TO=${TO:-runs/$NAME}
if [[ ! $TO =~ ^[A-Za-z0-9_./-]+$ || $TO == *:* ]]; then
  die "--to '$TO' must be a plain local path (e.g. runs/my-pod)."
fi
if [[ ! $PORT =~ ^[0-9]+$ ]] || ((PORT < 1 || PORT > 65535)); then
  die "--port '$PORT' is not a port number."
fi
need_tool gcloud "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)."
((COPY_ONLY)) || need_tool tensorboard "pip install tensorboard"

WHERE=(--zone="$ZONE")
[[ -n $PROJECT ]] && WHERE+=(--project="$PROJECT")
# One run, or every run (scp expands the * on the worker).
FROM="$NAME:$REMOTE_DIR/runs/${RUN_NAME:-*}"
# scp puts each copied directory inside TO, which must exist.
((DRY_RUN)) || mkdir -p "$TO"
run gcloud compute tpus tpu-vm scp --recurse "$FROM" "$TO" --worker=0 "${WHERE[@]}"
if ((COPY_ONLY)); then
  note "process 0's logs are in $TO"
  exit 0
fi
run tensorboard --logdir="$TO" --port="$PORT"
