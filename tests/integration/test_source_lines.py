"""Source lines as they were, on a real run: the window records the lines around the user function
its verdict names; after the user edits that file, ``vt-lightning summary`` still shows the
recorded lines and says the file changed since the window."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import orjson
import pytest
from conftest import loader, make_trainer

from vt_lightning import VizTraceCallback
from vt_lightning.cli.command import main
from vt_lightning.constants import SUMMARY_JSON_SUFFIX

pytestmark = pytest.mark.serial  # a python_bound verdict drawn from shares of short steps

USER_MODULE = """
import time

import lightning as L
import torch
from torch import nn


def spin(seconds):
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class Spinning(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        spin(0.03)
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
"""


def test_the_summary_shows_the_lines_as_they_were_after_the_file_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "user_code" / "spinning.py"
    source.parent.mkdir()
    source.write_text(USER_MODULE)
    spec = importlib.util.spec_from_file_location("spinning_user_module", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        callback = VizTraceCallback(wait=1, warmup=1, active=3, repeat=1, memory_snapshot=False)
        make_trainer(tmp_path / "logs", [callback], max_steps=7).fit(module.Spinning(), loader())
    finally:
        del sys.modules[spec.name]
    (path,) = sorted((tmp_path / "logs").rglob(f"*{SUMMARY_JSON_SUFFIX}"))
    summary = orjson.loads(path.read_bytes())
    def_line = USER_MODULE.splitlines().index("def spin(seconds):") + 1
    recorded = summary["sources"]["files"][str(source)]
    assert recorded["lines"][str(def_line)] == "def spin(seconds):"
    assert recorded["size"] == source.stat().st_size
    (verdict,) = [v for v in summary["verdicts"] if v["kind"] == "python_bound"]
    assert (verdict["where"][0]["function"], verdict["where"][0]["line"]) == ("spin", def_line)

    capsys.readouterr()
    assert main(["summary", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr().out
    assert f"python_bound: spin ({source}:{def_line})\n" in out  # unchanged: no note
    source.write_text("# two lines added\n# at the top\n" + USER_MODULE)  # the user edits the script
    assert main(["summary", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr().out
    assert f"python_bound: spin ({source}:{def_line}) [changed since this window: lines as they were]" in out
    assert f">{def_line:5d} | def spin(seconds):" in out  # the line that ran, not today's line there
