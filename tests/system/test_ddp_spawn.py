"""``strategy="ddp_spawn"`` pickles the Trainer, callbacks included, into each spawned rank: a
VizTraceCallback given in code, or made by ``VT_LIGHTNING=1``, travels there and records every
rank's windows and the job timeline, as ``ddp`` does (issue 50). Real spawned gloo ranks on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.paths import SCRIPTS

from vt_lightning.export.layout import host_name

pytestmark = pytest.mark.serial  # two spawned ranks and their writers on 2 cores

SCRIPT = SCRIPTS / "ddp" / "train_spawn.py"
SPAN = "0000000002"  # wait=1, warmup=1, active=2: batches 2-3


@pytest.mark.parametrize("how", ["code", "env"])
def test_ddp_spawn_records_every_rank_and_the_job_timeline(tmp_path, how):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VT_LIGHTNING", "MASTER_", "LOCAL_RANK"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONFAULTHANDLER="1")
    if how == "env":
        env.update(VT_LIGHTNING="1", VT_LIGHTNING_WAIT="1", VT_LIGHTNING_WARMUP="1", VT_LIGHTNING_ACTIVE="2")
        env.update(VT_LIGHTNING_MEMORY_SNAPSHOT="false")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), how], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    window = tmp_path / "window_000-batches_2-3"
    host = host_name()
    traces = sorted(p.name for p in window.glob("*.pt.trace.json.gz"))
    assert traces == [f"{host}_{rank}.{SPAN}.pt.trace.json.gz" for rank in (0, 1)], proc.stderr[-3000:]
    ranks = json.loads((window / "job" / f"job.{SPAN}.ranks.json").read_text())
    assert (window / "job" / f"job.{SPAN}.json.gz").is_file()
    assert sorted(r["rank"] for r in ranks["ranks"]) == [0, 1], ranks
