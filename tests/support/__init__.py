"""What the tests import besides conftest's fixtures: the real TensorBoard plugin's checks
(``tbcheck``), the runs several test files read (``tab_run``, ``vision_fit``) and the repository's
paths (``paths``). The scripts the tests start as subprocesses are in ``tests/scripts/``."""
