"""The trainers' process group for collective and hybrid modes.

Trainer 0 hosts a torch TCPStore at PARAMSHARD_COLLECTIVE_ADDR (on that address
only: a socket bound there, or the one `paramshard run` bound before the address
exchange and handed over as PARAMSHARD_COLLECTIVE_FD); the others connect to it,
and ``init_process_group`` meets there. Gloo picks the interface its peers reach
it at from the host name, which on a machine with several addresses (or inside a
network namespace, where the name resolves to loopback) is the wrong one: it is
pinned with GLOO_SOCKET_IFNAME to the interface holding this trainer's address on
the route towards the store. Every wait has the job's deadline.
"""
from __future__ import annotations

import datetime
import fcntl
import gc
import ipaddress
import os
import socket
import struct
import time

import torch.distributed as dist

from paramshard.env import ClusterEnv
from paramshard.settings.process_variables import GLOO_IFNAME
from paramshard.errors import ConfigError, ParamshardError
from paramshard.log import get_logger

log = get_logger("collective")

SIOCGIFADDR = 0x8915      # linux/sockios.h: an interface's IPv4 address


class CollectiveError(ParamshardError):
    """The trainers' process group could not be formed or broke."""


def interface_of(address: str) -> str | None:
    """The network interface holding IPv4 ``address`` ('lo' for any loopback address)."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return "lo"
    except ValueError:
        return None
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:        # no IPv4 address on it
                continue
        if socket.inet_ntoa(raw[20:24]) == address:
            return name
    return None


def _own_address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return s.getsockname()[0]


def _pin_gloo_interface(store_host: str) -> None:
    if GLOO_IFNAME.read(os.environ):
        return                      # the user's choice
    mine = _own_address_towards(store_host)
    name = interface_of(mine)
    if name is None:
        log.warning("no network interface holds %s (this trainer's address towards %s): gloo picks one "
                    "from the host name; set GLOO_SOCKET_IFNAME if the trainers cannot connect", mine, store_host)
        return
    os.environ[GLOO_IFNAME.env] = name


def _store(env: ClusterEnv, addr: str, timeout: datetime.timedelta):
    """The trainers' store at ``addr`` (HOST:PORT): hosted here by trainer 0, reached by the others."""
    from torch.distributed import TCPStore
    host, _, port = addr.rpartition(":")
    what = f"the trainers' store at {addr} (hosted by trainer 0)"
    if env.trainer_id == 0:
        if env.collective_fd is not None:
            listener = socket.socket(fileno=env.collective_fd)
        else:
            listener = socket.create_server((host, int(port)), backlog=1024)
        try:
            store = TCPStore(host, int(port), env.num_trainers, True, timeout=timeout, wait_for_workers=False,
                             master_listen_fd=listener.fileno())
        except (RuntimeError, OSError) as exc:
            listener.close()
            raise CollectiveError(f"trainer 0 cannot host {what}: {exc}") from None
        listener.detach()          # the store owns the descriptor now
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while True:                    # trainer 0 may start a moment after this one
        try:
            return TCPStore(host, int(port), env.num_trainers, False, timeout=timeout)
        except (RuntimeError, OSError) as exc:
            if time.monotonic() > deadline:
                raise CollectiveError(f"trainer {env.trainer_id} could not reach {what} within "
                                      f"{timeout.total_seconds():g} s ({exc}); did trainer 0 start?") from None
            time.sleep(0.2)


def join(env: ClusterEnv) -> None:
    """Form the default process group of the job's trainers (rank = trainer id)."""
    if dist.is_initialized():
        raise ConfigError("torch.distributed is already initialized in this process: paramshard's collective "
                          "and hybrid modes form the trainers' group themselves (one Trainer per process)")
    if env.collective_backend == "nccl":
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("PARAMSHARD_COLLECTIVE_BACKEND=nccl needs CUDA, which this process does not have: "
                              "use gloo (the default)")
    timeout = datetime.timedelta(seconds=env.timeout)
    if env.num_trainers == 1 and not env.collective_addr:
        store = dist.HashStore()        # one trainer (a standalone run): a group of one
    else:
        # The store first: its connect retries until trainer 0 is up, and only then does
        # trainer 0's name surely resolve (on Kubernetes its DNS record comes with its pod).
        addr = env.collective_addr
        assert addr, "ClusterEnv refuses a collective job of several trainers without the store's address"
        store = _store(env, addr, timeout)
        _pin_gloo_interface(addr.rpartition(":")[0])
    prefix = dist.PrefixStore(f"paramshard/{env.job_id or 'job'}", store)
    try:
        dist.init_process_group(env.collective_backend, store=prefix, rank=env.trainer_id,
                                world_size=env.num_trainers, timeout=timeout)
    except Exception as exc:      # torch raises DistStoreError / RuntimeError on a deadline
        raise CollectiveError(f"trainer {env.trainer_id}: the {env.num_trainers} trainers did not all join the "
                              f"{env.collective_backend} group at {env.collective_addr} within {env.timeout:g} s: "
                              f"{exc}") from None
    log.info("trainer %d joined the %s group of %d trainers (store %s)", env.trainer_id, env.collective_backend,
             env.num_trainers, env.collective_addr or "in this process")


def barrier(trainer_id: int, timeout: float) -> None:
    """Every trainer reached this point; a missing one is named (gloo's monitored barrier)."""
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout), wait_all_ranks=True)
        else:
            dist.barrier()
    except Exception as exc:
        raise CollectiveError(f"trainer {trainer_id}: barrier failed: {exc}") from None


def broadcast_json(trainer_id: int, value, timeout: float):
    """Trainer 0's ``value`` (a small JSON value, json_value.py) on every trainer: its JSON bytes
    in a uint8 tensor, its length first (so the others allocate only what is announced, within
    json_value.MAX_BYTES). Bytes, not torch's broadcast_object_list: that one pickles."""
    import torch
    from paramshard import json_value
    data = json_value.encoded(value) if trainer_id == 0 else b""
    try:
        length = torch.tensor([len(data)], dtype=torch.int64)
        _broadcast(length, timeout)
        size = int(length.item())
        if not 0 <= size <= json_value.MAX_BYTES:
            raise CollectiveError(f"trainer {trainer_id}: trainer 0 announced a broadcast of {size} bytes "
                                  f"(at most {json_value.MAX_BYTES})")
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if trainer_id == 0 and size \
            else torch.empty(size, dtype=torch.uint8)
        if size:
            _broadcast(payload, timeout)
    except CollectiveError:
        raise
    except Exception as exc:       # gloo's errors: a peer gone, the deadline
        raise CollectiveError(f"trainer {trainer_id}: broadcast from trainer 0 failed: {exc}") from None
    return value if trainer_id == 0 else json_value.decoded(payload.numpy().tobytes())


def _broadcast(tensor, timeout: float) -> None:
    work = dist.broadcast(tensor, src=0, async_op=True)
    if not work.wait(timeout=datetime.timedelta(seconds=timeout)):
        raise CollectiveError(f"the broadcast did not complete within {timeout:g} s")


def leave() -> None:
    if dist.is_initialized():
        # Whatever still holds the group (a dropped DDP wrapper in a reference cycle) goes
        # first: a gloo thread still finishing the last allreduce when the interpreter exits
        # aborts the process ("terminate called without an active exception", exit 134).
        gc.collect()
        dist.destroy_process_group()


# What gloo says when a peer trainer is gone or silent (its own words, from pair.cc).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out")


def explain(exc: BaseException, trainer_id: int, num_trainers: int, step: int) -> CollectiveError | None:
    """The allreduce of a step failed: an error naming the trainers it may be about, or
    None when ``exc`` is not a communication failure."""
    text = str(exc)
    if not any(marker in text for marker in _PEER_GONE):
        return None
    others = [t for t in range(num_trainers) if t != trainer_id]
    who = f"trainer {others[0]}" if len(others) == 1 else f"one of trainers {others}"
    first_line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return CollectiveError(f"trainer {trainer_id}: the allreduce of step {step} failed: {who} stopped answering "
                           f"(died, or hung longer than PARAMSHARD_TIMEOUT); look at its log for the cause. "
                           f"gloo said: {first_line}")
