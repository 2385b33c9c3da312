#!/usr/bin/env bash
# A stand-in for a container runtime, for the tests of CONTAINER_EXEC (slurm/site.env) where
# there is no podman or Apptainer. Used as
#     CONTAINER_EXEC='bash tests/container_standin/record_exec.sh --out DIR --path IMAGE_PATH [...] --'
# it does what the job scripts rely on a runtime for, and records what it was handed:
#  - DIR/<host>-<pid>.argv: the command it was asked to run, one argument per line;
#  - DIR/<host>-<pid>.env:  the environment it got (env -0: NUL-separated), before its changes;
#  - then runs the command with PATH=IMAGE_PATH (an image's PATH: the runtime's, not the host's,
#    as Apptainer does and podman with --env PATH=), the rest of the environment passed on
#    (podman's --env-host, Apptainer's default).
# Options that make it a badly configured container, for the one-line errors:
#  --clean-env   pass no environment but PATH (podman without --env-host, apptainer --cleanenv)
#  --hide DIR    DIR looks empty inside (a path not bound): a tmpfs over it, in a mount namespace
#                of its own (unshare -rm, which needs user namespaces)
#  --cd DIR      start in DIR (a runtime that does not start in the repository)
#  --env N=V     set N=V over what the job passed (an image's own variable, Apptainer keeps it)
set -euo pipefail

out="" path="$PATH" clean=0 hide=() cd_to="" setenv=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --path) path="$2"; shift 2 ;;
    --clean-env) clean=1; shift ;;
    --hide) hide+=("$2"); shift 2 ;;
    --cd) cd_to="$2"; shift 2 ;;
    --env) setenv+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "error: record_exec.sh: no command given" >&2; exit 2; }
[ -n "$out" ] || { echo "error: record_exec.sh: --out DIR is required" >&2; exit 2; }

mkdir -p "$out"
tag="$out/$(hostname)-$$"
printf '%s\n' "$@" > "$tag.argv"
env -0 > "$tag.env"

[ -z "$cd_to" ] || cd "$cd_to"
[ ${#setenv[@]} -eq 0 ] || export "${setenv[@]}"
if [ "$clean" = 1 ]; then
  set -- env -i PATH="$path" HOME="${HOME:-/}" "$@"
else
  export PATH="$path"
fi
if [ ${#hide[@]} -gt 0 ]; then
  # a tmpfs over each hidden folder, then the command (the working directory is re-entered,
  # so a hidden repository hides the working directory too)
  exec unshare -rm sh -c 'wd=$(pwd); n=$1; shift; while [ "$n" -gt 0 ]; do mount -t tmpfs none "$1"; shift; n=$((n-1)); done; cd "$wd" 2>/dev/null || cd /; exec "$@"' \
    hide "${#hide[@]}" "${hide[@]}" "$@"
fi
exec "$@"
