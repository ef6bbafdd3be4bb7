#!/usr/bin/env bash
# Run `python -m rljax.training` on every worker of a TPU VM pod at once,
# with a log per worker; or follow those logs; or stop the run.
# See docs/tpu_pods.md.
set -euo pipefail

PROG=experiments/tpu/launch_pod.sh
# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() {
  cat <<EOF
Usage: $PROG --name NAME --zone ZONE --config CONFIG [options] output.checkpoint_directory=gs://BUCKET/PATH [section.field=value ...]
       $PROG --name NAME --zone ZONE --logs [--worker N|all] [--run-name RUN]
       $PROG --name NAME --zone ZONE --stop

Launch (the default): runs the same command on every worker at once
(gcloud compute tpus tpu-vm ssh --worker=all):

  cd ~/rljax && .venv/bin/python -u -m rljax.training --config CONFIG \\
    --distributed=on [--dry_run] [--fresh] output.directory=runs/RUN \\
    section.field=value ...

jax.distributed finds the other workers itself on a TPU VM pod (no
coordinator address, no Pathways). Each worker writes its own log to
~/rljax-logs/RUN.<hostname>.log. Process 0 (worker 0) alone writes metrics,
TensorBoard events, rollouts and plots, to its local output.directory,
~/rljax/runs/RUN on worker 0 (this script sets it; tensorboard.sh copies it
from there). Every worker writes its part of each checkpoint to
output.checkpoint_directory, so that must be shared storage: a gs:// path
(required unless --allow-local-checkpoints).

Required (launch):
  --name NAME            the TPU VM (from create_pod.sh or queued_resources.sh)
  --zone ZONE            its zone
  --config CONFIG        a config file, relative to the repository root
                         (e.g. configs/grpo.py)
  output.checkpoint_directory=gs://BUCKET/PATH
                         among the overrides

Options:
  --project PROJECT      Google Cloud project (default: gcloud config)
  --train-dry-run        pass --dry_run: compile and run one step at the full
                         shapes on the pod, print memory, exit
  --fresh                pass --fresh: ignore the checkpoints in
                         output.checkpoint_directory
  --detach               start the run in the background (nohup) and return;
                         follow it with --logs. Without it the workers' output
                         streams here until the run ends.
  --run-name RUN         names output.directory=runs/RUN and the log files
                         (default: the last part of output.checkpoint_directory
                         other than 'checkpoints': grpo for
                         gs://my-bucket/rljax/grpo/checkpoints)
  --remote-dir DIR       the source directory on the workers (default: rljax)
  --allow-local-checkpoints
                         allow an output.checkpoint_directory that is not gs://
                         (a file system mounted at the same path on every
                         worker)
  --logs                 follow the log of --worker (default 0, process 0)
  --worker N|all         which worker --logs reads
  --lines N              lines of history --logs shows first (default 100)
  --stop                 stop the training processes on every worker
  --dry-run              print every command instead of running it
  -h, --help             show this help

Example:
  $PROG --name my-pod --zone us-central2-b --config configs/grpo.py \\
    output.checkpoint_directory=gs://my-bucket/rljax/grpo/checkpoints output.checkpoint_every=10
EOF
}

NAME="" ZONE="" PROJECT="" CONFIG="" RUN_NAME="" REMOTE_DIR="rljax"
TRAIN_DRY_RUN=0 FRESH=0 DETACH=0 ALLOW_LOCAL=0 MODE=launch WORKER=0 LINES=100
OVERRIDES=()

while [[ $# -gt 0 ]]; do
  case $1 in
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --config) need_value "$@"; CONFIG=$2; shift 2 ;;
    --run-name) need_value "$@"; RUN_NAME=$2; shift 2 ;;
    --remote-dir) need_value "$@"; REMOTE_DIR=$2; shift 2 ;;
    --train-dry-run) TRAIN_DRY_RUN=1; shift ;;
    --fresh) FRESH=1; shift ;;
    --detach) DETACH=1; shift ;;
    --allow-local-checkpoints) ALLOW_LOCAL=1; shift ;;
    --logs) MODE=logs; shift ;;
    --stop) MODE=stop; shift ;;
    --worker) need_value "$@"; WORKER=$2; shift 2 ;;
    --lines) need_value "$@"; LINES=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --dry_run) die "--dry_run is the trainer's flag; here it is --train-dry-run (--dry-run prints the gcloud commands)." ;;
    -*) die "unknown option '$1'." ;;
    *=*) OVERRIDES+=("$1"); shift ;;
    *) die "'$1' is not an option or a section.field=value override." ;;
  esac
done

require --name "$NAME"
require --zone "$ZONE"
check_name --name "$NAME"
check_zone "$ZONE"
check_remote_dir "$REMOTE_DIR"
check_run_name "$RUN_NAME"
need_tool gcloud "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)."

WHERE=(--zone="$ZONE")
[[ -n $PROJECT ]] && WHERE+=(--project="$PROJECT")
SSH=(gcloud compute tpus tpu-vm ssh "$NAME" "${WHERE[@]}")
# shellcheck disable=SC2088  # the workers' shell expands it
LOGS='~/rljax-logs'

if [[ $MODE == logs ]]; then
  if [[ $WORKER != all ]]; then
    [[ $WORKER =~ ^[0-9]+$ ]] || die "--worker '$WORKER' must be a worker number or all."
  fi
  check_positive_int --lines "$LINES"
  ((${#OVERRIDES[@]} == 0)) || die "--logs takes no overrides."
  if [[ -n $RUN_NAME ]]; then
    FILES="$LOGS/$RUN_NAME.*.log"
  else
    FILES="\"\$(ls -t $LOGS/*.log | head -n 1)\""
  fi
  run "${SSH[@]}" --worker="$WORKER" --command="tail -n $LINES -F $FILES"
  exit 0
fi

if [[ $MODE == stop ]]; then
  ((${#OVERRIDES[@]} == 0)) || die "--stop takes no overrides."
  # [r] keeps pkill from matching the shell that runs this very command.
  run "${SSH[@]}" --worker=all \
    --command="pkill -f '[r]ljax.training' && echo \"\$(hostname): stopped\" || echo \"\$(hostname): no rljax.training process\""
  exit 0
fi

# --- launch ----------------------------------------------------------------
require --config "$CONFIG"
if [[ $CONFIG == /* || $CONFIG == *..* || ! $CONFIG =~ ^[A-Za-z0-9_./-]+\.py$ ]]; then
  die "--config '$CONFIG' must be a .py file relative to the repository root (e.g. configs/grpo.py)."
fi
[[ -f $REPO_ROOT/$CONFIG ]] || die "--config '$CONFIG' not found in $REPO_ROOT (the workers run the same checkout; see configs/)."
CHECKPOINTS=""
for item in "${OVERRIDES[@]}"; do
  [[ $item =~ ^[a-z_]+(\.[A-Za-z0-9_]+)+=.* ]] || die "override '$item' must look like section.field=value."
  case $item in
    output.directory=*://*)
      die "output.directory='${item#*=}': logs are appended locally by process 0, so this must be a local path (this script sets output.directory=runs/RUN; --run-name RUN). Put checkpoints on shared storage with output.checkpoint_directory=gs://BUCKET/PATH instead." ;;
    output.directory=*)
      die "this script sets output.directory=runs/RUN on the workers itself, where process 0 writes its logs and tensorboard.sh finds them; choose RUN with --run-name instead of '$item'." ;;
    output.checkpoint_directory=*) CHECKPOINTS=${item#output.checkpoint_directory=} ;;
  esac
done
if [[ -z $CHECKPOINTS ]]; then
  die "set output.checkpoint_directory=gs://BUCKET/PATH: on a pod every worker writes its part of each checkpoint there, so it must be shared storage."
fi
if [[ $CHECKPOINTS != gs://* ]] && ((!ALLOW_LOCAL)); then
  die "output.checkpoint_directory='$CHECKPOINTS' is not a gs:// path; each worker would write its part of each checkpoint to its own disk and none could be restored (--allow-local-checkpoints for a file system mounted on every worker)."
fi
if [[ $CHECKPOINTS == gs://* && ! $CHECKPOINTS =~ ^gs://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/.*)?$ ]]; then
  die "output.checkpoint_directory='$CHECKPOINTS' is not a valid gs://BUCKET/PATH."
fi
if [[ -z $RUN_NAME ]]; then
  # gs://my-bucket/rljax/grpo/checkpoints or gs://my-bucket/rljax/grpo: grpo.
  RUN_NAME=${CHECKPOINTS%/}
  [[ ${RUN_NAME##*/} == checkpoints ]] && RUN_NAME=${RUN_NAME%/*}
  RUN_NAME=${RUN_NAME##*/}
  [[ $RUN_NAME =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || RUN_NAME=rljax
fi

TRAIN=(.venv/bin/python -u -m rljax.training --config "$CONFIG" --distributed=on)
((TRAIN_DRY_RUN)) && TRAIN+=(--dry_run)
((FRESH)) && TRAIN+=(--fresh)
TRAIN+=("output.directory=runs/$RUN_NAME" "${OVERRIDES[@]}")
LOG="$LOGS/$RUN_NAME.\$(hostname).log"
PREP="cd ~/$REMOTE_DIR && mkdir -p $LOGS"
if ((DETACH)); then
  REMOTE="$PREP && nohup $(shell_join "${TRAIN[@]}") > $LOG 2>&1 < /dev/null & echo \"\$(hostname): started, log $LOG\""
else
  REMOTE="set -o pipefail; $PREP && $(shell_join "${TRAIN[@]}") 2>&1 | tee $LOG"
fi
note "running on every worker of '$NAME'; per-worker logs: $LOG; process 0 writes metrics and TensorBoard events to ~/$REMOTE_DIR/runs/$RUN_NAME on worker 0"
run "${SSH[@]}" --worker=all --command="$REMOTE"
AGAIN="--name $NAME --zone $ZONE"
[[ -n $PROJECT ]] && AGAIN+=" --project $PROJECT"
[[ $REMOTE_DIR == rljax ]] || AGAIN+=" --remote-dir $REMOTE_DIR"
if ((DETACH)); then
  note "follow process 0: $PROG $AGAIN --logs --run-name $RUN_NAME"
fi
note "TensorBoard: experiments/tpu/tensorboard.sh $AGAIN --run-name $RUN_NAME"
