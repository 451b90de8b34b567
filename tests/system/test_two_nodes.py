"""Two nodes simulated on one machine (issue 50): two ``torchrun --nnodes 2 --nproc_per_node 2``
launchers (static rendezvous on 127.0.0.1, gloo on CPU), each in its own UTS namespace with its own
host name (``unshare --uts``, root only), so every rank sees ``node0`` or ``node1`` as its host and
the job spans two "hosts" that share one physical clock. The training is
``tests/scripts/ddp/two_nodes.py``: one window, batches 2-3, a barrier in every step.

* ``test_on_s3_…``: the log dir on moto's S3 server (the remote-root tests' ``s3_server``): one
  job file, made by rank 0 from the store;
* ``test_node_local_…``: node-local log dirs (no shared storage): each node also gets a private
  mount namespace where its own directory is bind-mounted on the same path; ``vt-lightning job``
  builds the job file afterwards.

The files are read back with the real readers (the command's, torch-tb-profiler's parser). Both
tests need root for the namespaces and are skipped, with that reason, without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import tbcheck
from support.paths import SCRIPTS
from support.s3 import free_port

from vt_lightning.cli.command import load_windows
from vt_lightning.export.reading import MemoryBudget, read_trace

pytestmark = pytest.mark.serial  # 4 ranks and 2 launchers: the whole 2-core machine

SCRIPT = SCRIPTS / "ddp" / "two_nodes.py"
WINDOW = "window_000-batches_2-3"
SPAN = "0000000002"
RUN_TIMEOUT = 240
_FOREIGN_ENV = re.compile(
    r"^(VT_LIGHTNING|SLURM_|TORCHELASTIC_|PMI_|OMPI_|LSB_|JSM_)|^(LOCAL_RANK|RANK|WORLD_SIZE|NODE_RANK|"
    r"GROUP_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|KUBERNETES_SERVICE_HOST)$"
)


def _namespaces_refused() -> str | None:
    """Why this machine cannot give each node its own host name and mounts, or None."""
    if os.geteuid() != 0:
        return "simulating two hosts needs root (unshare --uts --mount); CI runs the system tier as root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(
        ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", "hostname probe"],
        capture_output=True,
        text=True,
    )
    return None if done.returncode == 0 else f"unshare --uts --mount is refused here: {done.stderr.strip()}"


@pytest.fixture(scope="module", autouse=True)
def _needs_namespaces() -> None:
    refused = _namespaces_refused()
    if refused:
        pytest.skip(refused)


def run_nodes(
    tmp: Path, env: dict[str, str], dirpath: str, node_local: Path | None = None, *script_args: str
) -> dict[str, Any]:
    """Both nodes' launchers, to the end. ``node_local``: each node's ``<node_local>/node<N>`` is
    mounted on ``dirpath`` in that node's namespace only. Returns the ranks' RESULT lines and the
    launchers' output."""
    env = {k: v for k, v in env.items() if not _FOREIGN_ENV.search(k)}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    port = free_port()
    options = " ".join(script_args)
    launchers = []
    for node in (0, 1):
        torchrun = (
            f"{sys.executable} -m torch.distributed.run --nnodes 2 --nproc_per_node 2 --node_rank {node} "
            f"--master_addr 127.0.0.1 --master_port {port} {SCRIPT} --dirpath {dirpath} --num-nodes 2 --devices 2 "
            + options
        )
        unshare = ["unshare", "--uts"]
        mount = ""
        if node_local is not None:
            (node_local / f"node{node}").mkdir(parents=True)
            Path(dirpath).mkdir(parents=True, exist_ok=True)
            unshare += ["--mount", "--propagation", "private"]
            mount = f"mount --bind {node_local / f'node{node}'} {dirpath} && "
        script = f"hostname node{node} && {mount}exec {torchrun}"
        launchers.append(
            subprocess.Popen(
                [*unshare, "sh", "-c", script],
                cwd=tmp,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs = []
    deadline = time.monotonic() + RUN_TIMEOUT
    for launcher in launchers:
        try:
            output, _ = launcher.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for other in launchers:
                os.killpg(other.pid, signal.SIGKILL)
            output, _ = launcher.communicate()
            pytest.fail(f"the two-node job did not finish within {RUN_TIMEOUT} s (hang?):\n{output[-4000:]}")
        outputs.append(output)
        assert launcher.returncode == 0, output[-4000:]
    text = "\n".join(outputs)
    ranks = {r["rank"]: r for r in (json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT "))}
    assert sorted(ranks) == [0, 1, 2, 3], text[-4000:]
    return {"ranks": ranks, "output": text}


def job_ranks(job: dict[str, Any]) -> list[tuple[int, str]]:
    return [(r["rank"], r["host"]) for r in job["vt_lightning_job"]["ranks"]]


HOSTS = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}


# --------------------------------------------------------------------------------------------------
# The log dir on an S3-compatible server: one job timeline
# --------------------------------------------------------------------------------------------------


def test_on_s3_one_job_timeline_names_both_hosts_with_aligned_clocks(tmp_path, s3_server):
    import fsspec

    root = "s3://vt-bucket/run"
    run = run_nodes(tmp_path, s3_server, root)
    assert "4 ranks on one timeline, collective exits within " in run["output"]
    assert f": {root}/{WINDOW}/job/job.{SPAN}.json.gz; " in run["output"]  # the console names the job file
    assert {r: (v["host"], v["node"], v["world"]) for r, v in run["ranks"].items()} == {
        r: (host, r // 2, 4) for r, host in HOSTS.items()
    }
    for rank, host in HOSTS.items():  # each rank's files named by its host
        assert run["ranks"][rank]["traces"] == [f"{root}/{WINDOW}/{host}_{rank}.{SPAN}.pt.trace.json.gz"]
    local = tmp_path / "copy"  # the store's files, read here with the local readers
    fsspec.filesystem("s3").get(f"vt-bucket/run/{WINDOW}", str(local), recursive=True)
    job = read_trace(local / "job" / f"job.{SPAN}.json.gz", MemoryBudget())
    assert job_ranks(job) == sorted(HOSTS.items())
    processes = {e["args"]["name"] for e in job["traceEvents"] if e.get("name") == "process_name"}
    assert {f"rank {r} · main process" for r in HOSTS} <= processes
    for rank in job["vt_lightning_job"]["ranks"]:  # one physical clock: the true offset is 0
        if rank["host"] == "node0":
            assert rank["offset_us"] == 0.0
        else:
            assert rank["same_host"] is False and rank["uncertainty_us"] > 0
            assert abs(rank["offset_us"]) <= rank["uncertainty_us"]
    ranks_file = json.loads((local / "job" / f"job.{SPAN}.ranks.json").read_text())
    assert [r["host"] for r in ranks_file["ranks"]] == list(HOSTS.values())
    windows = load_windows(root)  # the command reads the store itself
    assert sorted(w["window"]["trace"] for w in windows) == sorted(
        f"{host}_{rank}.{SPAN}.pt.trace.json.gz" for rank, host in HOSTS.items()
    )
    (first,) = [w for w in windows if w["window"]["trace"].startswith("node0_0.")]
    summary_job = first["job"]  # rank 0's summary on the store holds the job, bounds included
    assert [(r["rank"], r["host"]) for r in summary_job["ranks"]] == sorted(HOSTS.items())
    assert all(r["uncertainty_us"] is not None for r in summary_job["ranks"] if r["host"] == "node1")
    for path in sorted(local.glob(f"*.{SPAN}.pt.trace.json.gz")):
        tbcheck.parse_trace(path, allowed_warnings=[r"communication op not belong to any step"])


# --------------------------------------------------------------------------------------------------
# Node-local log dirs (no shared storage): each node writes its own ranks; `vt-lightning job`
# --------------------------------------------------------------------------------------------------

# Rank 0's writer waits for the other hosts' traces up to min(30 s, writer_timeout / 2) before it
# knows the log dir is not shared (docs/distributed.md): 12 s here rather than 30.
WRITER_TIMEOUT = "24"


def test_node_local_dirs_each_hold_their_nodes_ranks_and_the_command_builds_the_job(tmp_path):
    nodes, logs = tmp_path / "nodes", tmp_path / "logs"
    run = run_nodes(tmp_path, dict(os.environ), str(logs), nodes, "--writer-timeout", WRITER_TIMEOUT)
    for rank, host in HOSTS.items():
        assert run["ranks"][rank]["traces"] == [f"{logs}/{WINDOW}/{host}_{rank}.{SPAN}.pt.trace.json.gz"]
    for node in ("node0", "node1"):  # each node's directory holds its own ranks' files only
        written = sorted(p.name for p in (nodes / node / WINDOW).glob(f"*{'.pt.trace.json.gz'}"))
        assert written == [f"{host}_{r}.{SPAN}.pt.trace.json.gz" for r, host in HOSTS.items() if host == node]
    assert not any(logs.iterdir())  # nothing went past the nodes' mounts
    assert "the log dir is not shared between hosts" in run["output"]
    assert "`vt-lightning job <this log dir> <each other node's log dir>`" in run["output"]
    job_dir = nodes / "node0" / WINDOW / "job"
    assert [p.name for p in job_dir.iterdir()] == [f"job.{SPAN}.clock.json"]  # no job file, its clock kept

    command = [sys.executable, "-m", "vt_lightning", "job", str(nodes / "node0"), str(nodes / "node1")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{job_dir}/job.{SPAN}.json.gz: 4 ranks on one timeline (hosts node0, node1)\n"
    job = read_trace(job_dir / f"job.{SPAN}.json.gz", MemoryBudget())
    assert job_ranks(job) == sorted(HOSTS.items())
    for rank in job["vt_lightning_job"]["ranks"]:  # node1's clock exchange, kept by rank 0, aligns them
        if rank["host"] == "node1":
            assert rank["same_host"] is False and abs(rank["offset_us"]) <= rank["uncertainty_us"]
    processes = {e["args"]["name"] for e in job["traceEvents"] if e.get("name") == "process_name"}
    assert {f"rank {r} · main process" for r in HOSTS} <= processes
    # Rank 0's window directory itself, and a node's log dir where that window is found by its name;
    # never over the job file already there.
    command = [*command[:4], str(nodes / "node0" / WINDOW), str(nodes / "node1")]
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and f"job file job.{SPAN}.json.gz already there" in again.stderr, again.stderr
