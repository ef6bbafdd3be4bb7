"""Run on every worker of a TPU slice at once: joins the processes with
`jax.distributed.initialize()` (a TPU VM pod and GKE are detected without
arguments) and prints what this process sees. On a healthy v5litepod-16 each of
the 4 workers prints ``process i of 4: 4 local devices, 16 global``.

  experiments/tpu/create_pod.sh runs it after installing; by hand:
  gcloud compute tpus tpu-vm ssh my-pod --zone=us-west4-a --worker=all \
    --command="cd ~/rljax && .venv/bin/python experiments/tpu/check_devices.py"

Exits non-zero when the devices are not TPUs (``--allow-cpu`` for a local
try) or when the processes disagree with the device counts.
"""

import argparse
import sys


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description="Join the slice's processes and report its devices."
  )
  parser.add_argument(
    "--allow-cpu", action="store_true", help="do not fail on a CPU backend"
  )
  parser.add_argument(
    "--no-distributed",
    action="store_true",
    help="skip jax.distributed.initialize() (a single host)",
  )
  args = parser.parse_args(argv)

  import jax

  if not args.no_distributed:
    try:
      jax.distributed.initialize()
    except (ValueError, RuntimeError) as error:
      # A single TPU VM (or a laptop) has no peers to find.
      print(f"jax.distributed.initialize() skipped: {error}", flush=True)
  local, total = jax.local_device_count(), jax.device_count()
  kind = jax.devices()[0].device_kind
  print(
    f"process {jax.process_index()} of {jax.process_count()}:"
    f" {local} local devices, {total} global ({kind})",
    flush=True,
  )
  if jax.default_backend() != "tpu" and not args.allow_cpu:
    print(f"error: the backend is {jax.default_backend()}, not tpu.")
    return 1
  if local * jax.process_count() != total:
    print(
      f"error: {jax.process_count()} processes x {local} local devices"
      f" != {total} global devices; a worker is missing or saw another"
      " slice."
    )
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
