# The pod's environment in login shells (SSH sessions): written by podguard-entrypoint at container start.
# shellcheck disable=SC1091
[ -r /etc/rp_environment ] && . /etc/rp_environment
