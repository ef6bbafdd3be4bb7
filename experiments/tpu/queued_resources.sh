#!/usr/bin/env bash
# Ask for a TPU slice through the queued-resources API, wait until it is
# ACTIVE, then hand over to create_pod.sh (install) and launch_pod.sh (run).
# See docs/tpu_pods.md.
set -euo pipefail

PROG=experiments/tpu/queued_resources.sh
# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() {
  cat <<EOF
Usage: $PROG create   --name QR --zone ZONE [--node-id NODE] [options]
       $PROG wait     --name QR --zone ZONE [--poll-seconds S] [--timeout-minutes M]
       $PROG describe --name QR --zone ZONE
       $PROG delete   --name QR --zone ZONE

create    gcloud compute tpus queued-resources create QR --node-id=NODE ...
          The request waits in Google's queue until the capacity is free; then
          the TPU VM NODE exists (state ACTIVE) and is yours until deleted.
wait      polls 'queued-resources describe' until the state is ACTIVE (exit 0)
          or FAILED/SUSPENDED (exit 1), then prints the next commands:
          create_pod.sh --skip-create (install) and launch_pod.sh (train).
describe  prints the request, its state and why it waits.
delete    deletes the request and, with it, the TPU VM (--force).

Options:
  --name QR                the queued resource's id
  --zone ZONE              e.g. us-central2-b
  --project PROJECT        Google Cloud project (default: gcloud config)
  --node-id NODE           the TPU VM's name (default: QR)
  --accelerator-type TYPE  (create) default v5litepod-16
  --runtime-version V      (create) default: by TPU type (see create_pod.sh)
  --spot                   (create) Spot capacity: sooner, cheaper, preemptible
  --valid-until-duration D (create) give up if not granted within D (e.g. 6h)
  --wait                   (create) then wait as 'wait' does
  --poll-seconds S         (wait) default 30
  --timeout-minutes M      (wait) default 0: no limit
  --dry-run                print every command instead of running it
  -h, --help               show this help

Example:
  $PROG create --name my-pod-qr --node-id my-pod --zone us-central2-b --accelerator-type v4-32 --spot --wait
EOF
}

ACTION=""
if [[ $# -gt 0 && $1 != -* ]]; then
  ACTION=$1
  shift
fi
NAME="" NODE="" ZONE="" PROJECT="" ACCEL="v5litepod-16" RUNTIME="" SPOT=0
VALID_UNTIL="" WAIT=0 POLL=30 TIMEOUT=0

while [[ $# -gt 0 ]]; do
  case $1 in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --node-id) need_value "$@"; NODE=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --accelerator-type) need_value "$@"; ACCEL=$2; shift 2 ;;
    --runtime-version) need_value "$@"; RUNTIME=$2; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --valid-until-duration) need_value "$@"; VALID_UNTIL=$2; shift 2 ;;
    --wait) WAIT=1; shift ;;
    --poll-seconds) need_value "$@"; POLL=$2; shift 2 ;;
    --timeout-minutes) need_value "$@"; TIMEOUT=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1'." ;;
  esac
done

case $ACTION in
  create | wait | describe | delete) ;;
  "") die "say what to do: create, wait, describe or delete." ;;
  *) die "unknown action '$ACTION'; use create, wait, describe or delete." ;;
esac
require --name "$NAME"
require --zone "$ZONE"
check_name --name "$NAME"
check_zone "$ZONE"
NODE=${NODE:-$NAME}
check_name --node-id "$NODE"
check_accelerator --accelerator-type "$ACCEL"
RUNTIME=${RUNTIME:-$(default_runtime "$ACCEL")}
check_positive_int --poll-seconds "$POLL"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout-minutes '$TIMEOUT' must be a whole number of minutes."
if [[ -n $VALID_UNTIL && ! $VALID_UNTIL =~ ^[0-9]+[smhd]$ ]]; then
  die "--valid-until-duration '$VALID_UNTIL' must look like 30m, 6h or 2d."
fi
if [[ $ACTION != create ]]; then
  for flag in SPOT WAIT; do
    ((${!flag} == 0)) || die "--${flag,,} only applies to create."
  done
fi
need_tool gcloud "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)."

WHERE=(--zone="$ZONE")
[[ -n $PROJECT ]] && WHERE+=(--project="$PROJECT")
QR=(gcloud compute tpus queued-resources)

wait_active() {
  local describe=("${QR[@]}" describe "$NAME" "${WHERE[@]}" --format='value(state.state)')
  note "waiting for '$NAME' to be ACTIVE (polling every ${POLL}s)"
  if ((DRY_RUN)); then
    run "${describe[@]}"
    note "(repeated every ${POLL}s until the state is ACTIVE; FAILED or SUSPENDED stop with exit 1)"
  else
    local start=$SECONDS state
    while true; do
      state=$(run "${describe[@]}") || state="(describe failed; retrying)"
      note "$(date +%H:%M:%S) $NAME: ${state:-unknown}"
      case $state in
        ACTIVE) break ;;
        FAILED | SUSPENDED)
          note "the request ended as $state; '$PROG describe' says why."
          exit 1
          ;;
      esac
      if ((TIMEOUT && SECONDS - start > TIMEOUT * 60)); then
        note "still $state after $TIMEOUT minutes; the request stays queued ('$PROG delete' withdraws it)."
        exit 1
      fi
      sleep "$POLL"
    done
  fi
  local project=""
  [[ -n $PROJECT ]] && project=" --project $PROJECT"
  note "once '$NODE' is ACTIVE, install rljax on it and train:"
  note "  experiments/tpu/create_pod.sh --name $NODE --zone $ZONE$project --skip-create --copy-from ."
  note "  experiments/tpu/launch_pod.sh --name $NODE --zone $ZONE$project --config configs/grpo.py output.checkpoint_directory=gs://BUCKET/rljax/grpo/checkpoints"
}

case $ACTION in
  create)
    CREATE=("${QR[@]}" create "$NAME" --node-id="$NODE" "${WHERE[@]}"
      --accelerator-type="$ACCEL" --runtime-version="$RUNTIME")
    ((SPOT)) && CREATE+=(--spot)
    [[ -n $VALID_UNTIL ]] && CREATE+=(--valid-until-duration="$VALID_UNTIL")
    note "queueing $ACCEL as TPU VM '$NODE' in $ZONE (software version $RUNTIME)"
    run "${CREATE[@]}"
    ((WAIT)) && wait_active
    ;;
  wait) wait_active ;;
  describe) run "${QR[@]}" describe "$NAME" "${WHERE[@]}" ;;
  delete)
    note "deleting the queued resource '$NAME' and its TPU VM"
    run "${QR[@]}" delete "$NAME" "${WHERE[@]}" --force --quiet
    ;;
esac
