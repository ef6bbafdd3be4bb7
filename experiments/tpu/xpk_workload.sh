#!/usr/bin/env bash
# Train on TPUs in GKE with xpk: build and push an rljax image, create a
# cluster, submit `python -m rljax.training` as a workload. See
# docs/tpu_pods.md.
set -euo pipefail

PROG=experiments/tpu/xpk_workload.sh
# shellcheck source-path=SCRIPTDIR source=_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() {
  cat <<EOF
Usage: $PROG image   --docker-image IMAGE [--with-assets]
       $PROG cluster --cluster C --tpu-type TYPE --zone ZONE (--on-demand | --spot | --reservation R) [--num-slices N]
       $PROG create  --cluster C --workload W --tpu-type TYPE --docker-image IMAGE --config CONFIG [options] output.checkpoint_directory=gs://BUCKET/PATH [section.field=value ...]
       $PROG list    --cluster C [--zone ZONE]
       $PROG delete  --cluster C --workload W [--zone ZONE]
       $PROG delete-cluster --cluster C --zone ZONE

image           docker build -f experiments/tpu/Dockerfile -t IMAGE . && docker push IMAGE
                (rljax + jax[tpu] on Python 3.11, working directory /app)
cluster         xpk cluster create (GKE with TPU node pools; once)
create          xpk workload create ... --command "python -m rljax.training
                --config CONFIG --distributed=on section.field=value ..."
                GKE starts one container per TPU host; jax.distributed finds
                its peers from the environment GKE sets (no Pathways).
list, delete    xpk workload list / delete
delete-cluster  xpk cluster delete

Options:
  --cluster C           GKE cluster name
  --workload W          workload (job) name
  --tpu-type TYPE       e.g. v5litepod-16 (default), v4-32, v6e-16
  --num-slices N        slices (default 1; more than one is untested with rljax)
  --docker-image IMAGE  e.g. us-docker.pkg.dev/my-project/rljax/rljax:latest
  --config CONFIG       a config file inside the image, relative to /app
  --zone ZONE           zone of the TPUs (default: gcloud config)
  --project PROJECT     Google Cloud project (default: gcloud config)
  --on-demand | --spot | --reservation R
                        (cluster) where the capacity comes from
  --max-restarts N      (create) restart the job up to N times (resumes from
                        the checkpoints in output.checkpoint_directory);
                        default 0
  --train-dry-run       (create) pass --dry_run: one step at full shapes, memory
  --fresh               (create) pass --fresh: ignore existing checkpoints
  --with-assets         (image) also install requirements-assets.txt (SmolLM2)
  --dry-run             print every command instead of running it
  -h, --help            show this help

output.checkpoint_directory=gs://BUCKET/PATH is required among the overrides
of create: every host writes its part of each checkpoint there, and the hosts
share no disk (the node pool's service account needs write access to the
bucket). output.directory (metrics, TensorBoard events, rollouts, plots) must
stay a local path: process 0 appends to it inside its own container, where it
lives as long as that container; the progress bar is in the workload's logs.
EOF
}

ACTION=""
if [[ $# -gt 0 && $1 != -* ]]; then
  ACTION=$1
  shift
fi
CLUSTER="" WORKLOAD="" TPU_TYPE="v5litepod-16" SLICES=1 IMAGE="" CONFIG=""
ZONE="" PROJECT="" CAPACITY="" RESERVATION="" MAX_RESTARTS="" ASSETS=0
TRAIN_DRY_RUN=0 FRESH=0
OVERRIDES=()

while [[ $# -gt 0 ]]; do
  case $1 in
    --cluster) need_value "$@"; CLUSTER=$2; shift 2 ;;
    --workload) need_value "$@"; WORKLOAD=$2; shift 2 ;;
    --tpu-type) need_value "$@"; TPU_TYPE=$2; shift 2 ;;
    --num-slices) need_value "$@"; SLICES=$2; shift 2 ;;
    --docker-image) need_value "$@"; IMAGE=$2; shift 2 ;;
    --config) need_value "$@"; CONFIG=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --on-demand | --spot)
      [[ -z $CAPACITY ]] || die "give one of --on-demand, --spot, --reservation."
      CAPACITY=$1; shift ;;
    --reservation)
      need_value "$@"
      [[ -z $CAPACITY ]] || die "give one of --on-demand, --spot, --reservation."
      CAPACITY=--reservation; RESERVATION=$2; shift 2 ;;
    --max-restarts) need_value "$@"; MAX_RESTARTS=$2; shift 2 ;;
    --with-assets) ASSETS=1; shift ;;
    --train-dry-run) TRAIN_DRY_RUN=1; shift ;;
    --fresh) FRESH=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --dry_run) die "--dry_run is the trainer's flag; here it is --train-dry-run (--dry-run prints the commands)." ;;
    -*) die "unknown option '$1'." ;;
    *=*) OVERRIDES+=("$1"); shift ;;
    *) die "'$1' is not an option or a section.field=value override." ;;
  esac
done

case $ACTION in
  image | cluster | create | list | delete | delete-cluster) ;;
  "") die "say what to do: image, cluster, create, list, delete or delete-cluster." ;;
  *) die "unknown action '$ACTION'; use image, cluster, create, list, delete or delete-cluster." ;;
esac
[[ $ACTION == create ]] || ((${#OVERRIDES[@]} == 0)) || die "overrides only apply to create."
[[ -n $ZONE ]] && check_zone "$ZONE"
check_accelerator --tpu-type "$TPU_TYPE"
check_positive_int --num-slices "$SLICES"
if [[ -n $IMAGE && ! $IMAGE =~ ^[a-z0-9][a-z0-9.:_/-]*[a-z0-9](:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$ ]]; then
  die "--docker-image '$IMAGE' is not an image reference like us-docker.pkg.dev/my-project/rljax/rljax:latest."
fi

WHERE=()
[[ -n $ZONE ]] && WHERE+=(--zone="$ZONE")
[[ -n $PROJECT ]] && WHERE+=(--project="$PROJECT")

case $ACTION in
  image)
    require --docker-image "$IMAGE"
    need_tool docker "install Docker to build the image."
    cd "$REPO_ROOT"
    run docker build -f experiments/tpu/Dockerfile --build-arg WITH_ASSETS="$ASSETS" -t "$IMAGE" .
    run docker push "$IMAGE"
    ;;
  cluster)
    require --cluster "$CLUSTER"
    check_name --cluster "$CLUSTER"
    require --zone "$ZONE"
    [[ -n $CAPACITY ]] || die "say where the TPUs come from: --on-demand, --spot or --reservation NAME."
    need_tool xpk "pip install xpk (https://github.com/AI-Hypercomputer/xpk)."
    CREATE=(xpk cluster create --cluster="$CLUSTER" --tpu-type="$TPU_TYPE"
      --num-slices="$SLICES" "${WHERE[@]}")
    if [[ $CAPACITY == --reservation ]]; then
      CREATE+=(--reservation="$RESERVATION")
    else
      CREATE+=("$CAPACITY")
    fi
    run "${CREATE[@]}"
    ;;
  create)
    require --cluster "$CLUSTER"
    require --workload "$WORKLOAD"
    require --docker-image "$IMAGE"
    require --config "$CONFIG"
    check_name --cluster "$CLUSTER"
    check_name --workload "$WORKLOAD"
    [[ -z $CAPACITY ]] || die "$CAPACITY applies to cluster, not create."
    if [[ $CONFIG == /* || $CONFIG == *..* || ! $CONFIG =~ ^[A-Za-z0-9_./-]+\.py$ ]]; then
      die "--config '$CONFIG' must be a .py file relative to the repository root (e.g. configs/grpo.py)."
    fi
    [[ -f $REPO_ROOT/$CONFIG ]] || die "--config '$CONFIG' not found in $REPO_ROOT (the image holds this checkout; see configs/)."
    CHECKPOINTS=""
    for item in "${OVERRIDES[@]}"; do
      [[ $item =~ ^[a-z_]+(\.[A-Za-z0-9_]+)+=.* ]] || die "override '$item' must look like section.field=value."
      case $item in
        output.directory=*://*)
          die "output.directory='${item#*=}': logs are appended locally by process 0, so this must be a local path. Put checkpoints on shared storage with output.checkpoint_directory=gs://BUCKET/PATH instead." ;;
        output.checkpoint_directory=*) CHECKPOINTS=${item#output.checkpoint_directory=} ;;
      esac
    done
    [[ $CHECKPOINTS == gs://?* ]] || die "set output.checkpoint_directory=gs://BUCKET/PATH: the hosts share no disk, and every host writes its part of each checkpoint there."
    if [[ ! $CHECKPOINTS =~ ^gs://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/.*)?$ ]]; then
      die "output.checkpoint_directory='$CHECKPOINTS' is not a valid gs://BUCKET/PATH."
    fi
    if [[ -n $MAX_RESTARTS && ! $MAX_RESTARTS =~ ^[0-9]+$ ]]; then
      die "--max-restarts '$MAX_RESTARTS' must be a whole number."
    fi
    ((SLICES == 1)) || note "--num-slices $SLICES: rljax lays its mesh over all chips as one slice; multi-slice runs are untested."
    need_tool xpk "pip install xpk (https://github.com/AI-Hypercomputer/xpk)."
    TRAIN=(python -m rljax.training --config "$CONFIG" --distributed=on)
    ((TRAIN_DRY_RUN)) && TRAIN+=(--dry_run)
    ((FRESH)) && TRAIN+=(--fresh)
    TRAIN+=("${OVERRIDES[@]}")
    SUBMIT=(xpk workload create --cluster="$CLUSTER" --workload="$WORKLOAD"
      --tpu-type="$TPU_TYPE" --num-slices="$SLICES" --docker-image="$IMAGE"
      --command="$(shell_join "${TRAIN[@]}")" "${WHERE[@]}")
    [[ -n $MAX_RESTARTS ]] && SUBMIT+=(--max-restarts="$MAX_RESTARTS")
    run "${SUBMIT[@]}"
    ;;
  list)
    require --cluster "$CLUSTER"
    need_tool xpk "pip install xpk (https://github.com/AI-Hypercomputer/xpk)."
    run xpk workload list --cluster="$CLUSTER" "${WHERE[@]}"
    ;;
  delete)
    require --cluster "$CLUSTER"
    require --workload "$WORKLOAD"
    need_tool xpk "pip install xpk (https://github.com/AI-Hypercomputer/xpk)."
    run xpk workload delete --workload="$WORKLOAD" --cluster="$CLUSTER" "${WHERE[@]}"
    ;;
  delete-cluster)
    require --cluster "$CLUSTER"
    require --zone "$ZONE"
    need_tool xpk "pip install xpk (https://github.com/AI-Hypercomputer/xpk)."
    run xpk cluster delete --cluster="$CLUSTER" "${WHERE[@]}"
    ;;
esac
