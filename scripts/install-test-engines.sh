#!/usr/bin/env bash
# Install what the SSH/network-namespace engine tests (tests/engines/) need:
#   openssh-server (sshd), openssh-client (ssh, ssh-keygen), rsync, iproute2 (ip netns).
#
# - Idempotent: installs only what is missing (checked with dpkg-query); a second run
#   does nothing and touches no package index.
# - Never starts a system service: during the install a policy-rc.d that answers 101
#   ("action forbidden") is in place, so the packages' postinst scripts (invoke-rc.d /
#   deb-systemd-invoke) do not start the system sshd. An existing policy-rc.d that already
#   forbids starting ssh is left alone; any other one is set aside and restored afterwards.
#   Afterwards the script checks that no new sshd runs and nothing new listens on port 22,
#   and fails if one does (after stopping the processes it started, by PID).
# - Not root, or not a Debian-like system: prints why and exits 0; the engine tests then
#   skip with a message that names this script.
#
# Usage: sudo scripts/install-test-engines.sh
set -euo pipefail

PACKAGES=(openssh-server openssh-client rsync iproute2)
POLICY=/usr/sbin/policy-rc.d
BACKUP=/usr/sbin/policy-rc.d.paramshard-saved

say() { echo "install-test-engines: $*"; }

if [ "$(id -u)" -ne 0 ]; then
    say "not root: nothing installed; the engine tests (tests/engines) will skip."
    say "to run them: sudo $0"
    exit 0
fi
if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    say "no dpkg/apt-get here: install ${PACKAGES[*]} by hand; the engine tests skip until then."
    exit 0
fi

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

missing=()
for pkg in "${PACKAGES[@]}"; do
    installed "$pkg" || missing+=("$pkg")
done
# The binaries themselves, in case a package is installed but a file was removed.
for bin in sshd ssh ssh-keygen rsync ip; do
    if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null 2>&1; then
        case $bin in
            sshd) pkg=openssh-server ;; ssh|ssh-keygen) pkg=openssh-client ;;
            rsync) pkg=rsync ;; ip) pkg=iproute2 ;;
        esac
        [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    say "already installed: ${PACKAGES[*]}"
    exit 0
fi

# --- keep the postinst scripts from starting services --------------------------------
our_policy=0
restore_policy() {
    if [ "$our_policy" = 1 ]; then
        rm -f "$POLICY"
        if [ -e "$BACKUP" ]; then mv -f "$BACKUP" "$POLICY"; fi
        our_policy=0
    fi
}
trap restore_policy EXIT
forbids_ssh() { [ -x "$POLICY" ] && { "$POLICY" ssh start >/dev/null 2>&1; [ $? -eq 101 ]; }; }
if forbids_ssh; then
    say "an existing $POLICY already forbids starting services: keeping it"
else
    if [ -e "$POLICY" ]; then mv -f "$POLICY" "$BACKUP"; fi
    our_policy=1
    printf '#!/bin/sh\n# paramshard install-test-engines.sh: no service starts during the install\nexit 101\n' >"$POLICY"
    chmod 0755 "$POLICY"
fi

# sshd listeners: sshd processes whose parent is not an sshd (per-connection children of an
# sshd that ran before are somebody's sessions and are never touched).
sshd_pids() {
    ps -eo pid=,ppid=,comm= | awk '$3 == "sshd" { comm[$1] = 1; ppid[$1] = $2 }
        END { for (p in comm) if (!(ppid[p] in comm)) print p }' | sort
}
# Anything in LISTEN state on port 22 (read from /proc: ss may not be installed yet).
listens_22() { awk '$4 == "0A" && $2 ~ /:0016$/ { found = 1 } END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null; }
before_pids=$(sshd_pids)
before_22=0; if listens_22; then before_22=1; fi
systemd_running=0; [ -d /run/systemd/system ] && systemd_running=1
ssh_enabled_before=1
if [ "$systemd_running" = 1 ] && ! installed openssh-server; then
    systemctl is-enabled --quiet ssh.service 2>/dev/null || ssh_enabled_before=0
fi

say "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o Acquire::Retries=3 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
apt-get "${apt_opts[@]}" update -qq
apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}"

restore_policy

# --- verify that nothing was started ---------------------------------------------------
new_pids=$(comm -13 <(echo "$before_pids") <(sshd_pids) | sed '/^$/d' || true)
bad=0
if [ -n "$new_pids" ]; then
    say "ERROR: the install started sshd (PIDs: $(echo $new_pids)); stopping them"
    # shellcheck disable=SC2086
    kill $new_pids 2>/dev/null || true
    bad=1
fi
if [ "$before_22" = 0 ] && listens_22; then
    say "ERROR: something now listens on port 22 that did not before:"
    ss -Hltnp 'sport = :22' 2>/dev/null || true
    bad=1
fi
# On a machine booted with systemd, a fresh openssh-server is enabled for the next boot by
# its postinst; the tests start their own sshd, so undo that (only if we installed it).
if [ "$systemd_running" = 1 ] && [ "$ssh_enabled_before" = 0 ]; then
    systemctl disable --quiet ssh.service ssh.socket 2>/dev/null || true
fi
[ "$bad" = 0 ] || exit 1

for bin in sshd ssh ssh-keygen rsync ip; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$bin" >/dev/null
done
say "installed ${missing[*]}; no system sshd was started"
