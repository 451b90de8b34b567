"""Clock offsets between ranks, measured at each window's start (a side recorder): rank 0 exchanges
``ROUNDS`` ping-pongs with each other rank over a small gloo group (made at setup on every rank:
``new_group`` is collective), which its writer turns into offsets (``analysis/offsets.py``). Bounded
by ``TIMEOUT_S``; a failure costs one warning, and later windows go without it."""

from __future__ import annotations

import datetime
import socket
import warnings
import weakref
import zlib
from typing import Any

from vt_lightning.export.job_file import JOB_EXTRA
from vt_lightning.recording import clock_probes

ROUNDS = 8  # ping-pongs per rank and window: the tightest round trip is kept
TIMEOUT_S = 10.0
_GROUP: dict[str, Any] = {}  # "world": weakref to the default group it was made for, "group", "failed"


def host_id(host: str | None = None) -> int:
    """A host's name as an int64 that fits a tensor (crc32: equal names, equal ids)."""
    return zlib.crc32((host or socket.gethostname()).encode())


def prepare(ranks: Any, enabled: bool, warn: Any) -> None:
    """At setup, on every rank: the gloo group of the clock exchange, when every rank traces."""
    _GROUP.clear()
    if not enabled or ranks is not None:
        return
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
        world = dist.group.WORLD
        _GROUP.update(world=weakref.ref(world) if world is not None else None, group=group, failed=False)
    except Exception as err:  # no gloo group: job files align ranks on one host's clock, said once
        warn(
            "clock-sync-group",
            f"vt_lightning: could not create the gloo group for the ranks' clock offsets ({type(err).__name__}: "
            f"{err}); job files align the ranks on one host's shared clock only.",
        )


def group_for_this_run() -> Any:
    """The group made at setup if it still belongs to the live default group."""
    if not _GROUP:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    made_for = _GROUP.get("world")
    if made_for is not None and made_for() is not dist.group.WORLD:
        return None
    return _GROUP.get("group")


def exchange(
    group: Any, rank: int, world_size: int, rounds: int = ROUNDS
) -> tuple[dict[int, list[list[int]]], list[int]]:
    """The ping-pong: on rank 0 ``({peer: [[t0, t1, t2, t3], ...]}, host id of each rank)``, else empty."""
    import torch
    import torch.distributed as dist

    clock = clock_probes.wall_clock_ns
    samples: dict[int, list[list[int]]] = {}
    ping = torch.zeros(1, dtype=torch.int64)
    pong = torch.zeros(3, dtype=torch.int64)  # t1, t2, the peer's host id
    if rank == 0:
        hosts = [host_id()]
        for peer in range(1, world_size):
            mine = samples[peer] = []
            for _ in range(rounds):
                t0 = clock()
                ping[0] = t0
                dist.send(ping, dst=peer, group=group)
                dist.recv(pong, src=peer, group=group)
                t3 = clock()
                t1, t2, peer_host = (int(v) for v in pong.tolist())
                mine.append([t0, t1, t2, t3])
            hosts.append(peer_host)
        return samples, hosts
    me = host_id()
    for _ in range(rounds):
        dist.recv(ping, src=0, group=group)
        t1 = clock()
        pong[0], pong[2] = t1, me
        pong[1] = clock()
        dist.send(pong, dst=0, group=group)
    return samples, []


class ClockSync:
    """Side recorder: the ping-pong at window start; rank 0 hands the samples to its writer."""

    name = JOB_EXTRA

    def __init__(self, group: Any, rank: int, world_size: int, job_wait_s: float) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.job_wait_s = job_wait_s
        self.samples: dict[int, list[list[int]]] = {}
        self.hosts: list[int] = []
        self.error: str | None = None

    def start(self) -> None:
        if _GROUP.get("failed"):
            self.error = "the clock exchange failed earlier in this run"
            return
        try:
            self.samples, self.hosts = exchange(self.group, self.rank, self.world_size)
        except Exception as err:  # a rank that never came, a broken link: once, then never again this run
            _GROUP["failed"] = True
            self.error = f"{type(err).__name__}: {err}"
            warnings.warn(
                f"vt_lightning: the ranks' clock exchange failed ({self.error}); this run's job files "
                "align the ranks on one host's shared clock only.",
                stacklevel=1,
            )

    def stop(self) -> None:
        pass

    def collect(self) -> Any:
        if self.rank != 0:
            return None
        return {
            "world_size": self.world_size,
            "samples": {str(peer): s for peer, s in self.samples.items()},
            "host_ids": {str(r): h for r, h in enumerate(self.hosts)},
            "error": self.error,
            "job_wait_s": self.job_wait_s,
        }


def clock_sync_recorders(rank_info: dict[str, Any], writer_timeout: float) -> list[ClockSync]:
    """This window's recorder, when the run prepared a group (every rank traces, world > 1)."""
    group = group_for_this_run()
    if group is None:
        return []
    world = int(rank_info.get("world_size", 1))
    return [ClockSync(group, int(rank_info.get("global_rank", 0)), world, min(30.0, writer_timeout / 2))]
