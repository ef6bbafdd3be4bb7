# shellcheck shell=bash
# Shared helpers for experiments/tpu/*.sh. Sourced, never run on its own.
#
# Every script prints each gcloud/xpk/docker command it runs on a line of its
# own, starting with "+ " and shell-quoted so that the line can be pasted into
# a shell as is. With --dry-run it prints them (on stdout) and runs nothing.

DRY_RUN=0
# shellcheck disable=SC2034  # used by the scripts that source this file
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# One word, quoted for a POSIX shell only when it needs to be.
shell_quote() {
  local word=$1
  if [[ -n $word && $word =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
    printf '%s' "$word"
  else
    printf "'%s'" "${word//\'/\'\\\'\'}"
  fi
}

# A whole command line, each word quoted as needed.
shell_join() {
  local out="" word
  for word in "$@"; do
    out+="${out:+ }$(shell_quote "$word")"
  done
  printf '%s' "$out"
}

# Print a command; run it unless --dry-run was given.
run() {
  if ((DRY_RUN)); then
    printf '+ %s\n' "$(shell_join "$@")"
    return 0
  fi
  printf '+ %s\n' "$(shell_join "$@")" >&2
  "$@"
}

# A note for the reader (stderr, so that stdout holds only commands).
note() {
  printf '# %s\n' "$*" >&2
}

die() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  printf "Run '%s --help' for usage.\n" "$PROG" >&2
  exit 2
}

# `need_value FLAG "$@"`: FLAG must be followed by a non-empty value.
need_value() {
  if [[ $# -lt 2 || -z $2 || $2 == --* ]]; then
    die "$1 needs a value."
  fi
}

require() {
  local flag=$1 value=$2
  [[ -n $value ]] || die "$flag is required."
}

# Cloud TPU / GKE resource names: lowercase letters, digits and hyphens,
# starting with a letter, at most 63 characters.
check_name() {
  local flag=$1 value=$2
  if [[ ! $value =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
    die "$flag '$value' is not a valid name: use lowercase letters, digits and hyphens, starting with a letter (e.g. my-pod)."
  fi
}

check_zone() {
  local value=$1
  if [[ ! $value =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]]; then
    die "--zone '$value' is not a zone name like us-central2-b or europe-west4-a."
  fi
}

# v4-32, v5litepod-16, v5p-64, v6e-16, ...
check_accelerator() {
  local flag=$1 value=$2
  if [[ ! $value =~ ^v[0-9]+[a-z]*-[0-9]+$ ]]; then
    die "$flag '$value' is not a TPU type like v5litepod-16, v4-32, v5p-64 or v6e-16."
  fi
}

check_positive_int() {
  local flag=$1 value=$2
  if [[ ! $value =~ ^[1-9][0-9]*$ ]]; then
    die "$flag '$value' must be a positive integer."
  fi
}

# The TPU software version that Google recommends for JAX on each generation.
default_runtime() {
  case $1 in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-* | v5e-*) echo v2-alpha-tpuv5-lite ;;
    *) echo tpu-ubuntu2204-base ;;
  esac
}

# A path relative to the home directory on the workers (no spaces, no ~).
check_remote_dir() {
  local value=$1
  if [[ ! $value =~ ^[A-Za-z0-9_.][A-Za-z0-9_./-]*$ || $value == *..* ]]; then
    die "--remote-dir '$value' must be a plain path relative to the home directory on the workers (e.g. rljax)."
  fi
}

check_run_name() {
  local value=$1
  if [[ -n $value && ! $value =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
    die "--run-name '$value' may hold only letters, digits, '.', '_' and '-', starting with a letter or digit."
  fi
}

need_tool() {
  ((DRY_RUN)) && return 0
  command -v "$1" >/dev/null 2>&1 || die "$1 not found on PATH; $2"
}
