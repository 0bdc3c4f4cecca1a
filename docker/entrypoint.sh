#!/usr/bin/env bash
# podguard's container entrypoint (installed as /usr/local/bin/podguard-entrypoint; tini is PID 1).
#
#   docker run IMAGE                     -> $PODGUARD_DEFAULT_CMD (default: `podguard train`, the demo job)
#   docker run IMAGE train [ARGS]        -> exec podguard train ARGS (any podguard subcommand or option)
#   docker run IMAGE bash -c "..."       -> anything else is exec'd as is (RunPod start commands)
#
# RunPod conventions: with PUBLIC_KEY set and sshd installed, the key goes into ~/.ssh/authorized_keys
# and sshd starts in the background (a failure there is reported, never fatal). /workspace is RunPod's
# volume; podguard keeps its state there (PODGUARD_STATE_DIR) when it is writable.
set -u

log() { printf 'podguard-entrypoint: %s\n' "$*" >&2; }

start_sshd() {
  [ -n "${PUBLIC_KEY:-}" ] || return 0
  local sshd
  sshd=$(command -v sshd 2>/dev/null || true)
  [ -n "$sshd" ] || sshd=/usr/sbin/sshd
  if [ ! -x "$sshd" ]; then
    log "PUBLIC_KEY is set but sshd is not installed in this image; no SSH server started"
    return 0
  fi
  local home=${HOME:-/root}
  mkdir -p "$home/.ssh" && chmod 700 "$home/.ssh" || return 0
  touch "$home/.ssh/authorized_keys" && chmod 600 "$home/.ssh/authorized_keys" || return 0
  grep -qxF -- "$PUBLIC_KEY" "$home/.ssh/authorized_keys" || printf '%s\n' "$PUBLIC_KEY" >>"$home/.ssh/authorized_keys"
  mkdir -p /run/sshd 2>/dev/null
  ssh-keygen -A >/dev/null 2>&1
  # sshd daemonizes itself; it is not in the job's process group, so tini -g does not signal it.
  if "$sshd" -E /tmp/sshd.log; then
    log "sshd started (PUBLIC_KEY added to $home/.ssh/authorized_keys)"
  else
    log "sshd failed to start (see /tmp/sshd.log); continuing without SSH"
  fi
  return 0
}

# A state dir that works for non-root users too: podguard defaults to /workspace/.podguard when /workspace
# is writable; otherwise use a per-user folder instead of failing.
if [ -z "${PODGUARD_STATE_DIR:-}" ] && ! { [ -d /workspace ] && [ -w /workspace ]; }; then
  export PODGUARD_STATE_DIR="${XDG_STATE_HOME:-${TMPDIR:-/tmp}}/podguard-$(id -u)"
fi

(start_sshd) || true

if [ "$#" -eq 0 ]; then
  # Word-split like a shell command line (quotes are honoured): PODGUARD_DEFAULT_CMD="train --mode single"
  # or PODGUARD_DEFAULT_CMD="python serve.py".
  eval "set -- ${PODGUARD_DEFAULT_CMD:-train}"
fi

case "$1" in
  train | run | doctor | gpus | health | cleanup | sweep | pod | template | help | -*)
    exec podguard "$@"
    ;;
  podguard)
    shift
    exec podguard "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
