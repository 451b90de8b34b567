"""A real S3-compatible server for the tests of remote roots: moto's standalone server (a separate
process) on 127.0.0.1, reached through s3fs. tests/conftest.py imports the fixture, so every tier has it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1, and the environment that points s3fs at it (for this process
    through fsspec's config, for subprocesses through ``FSSPEC_S3_*``): the environment of a user
    whose store is not AWS."""
    pytest.importorskip("s3fs", reason="s3fs is in the `test` extra; without it s3:// cannot be tested")
    pytest.importorskip("moto.server", reason="moto[server] is in the `test` extra")
    import fsspec.config

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    with open(tmp_path / "moto.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(endpoint + "/", timeout=2):
                    break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start: {(tmp_path / 'moto.log').read_text()}") from None
                time.sleep(0.2)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        s3fs.S3FileSystem(endpoint_url=endpoint, key="x", secret="x").mkdir("vt-bucket")
        yield {**os.environ, **env}
    finally:
        server.terminate()
        server.wait(timeout=30)
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
