"""The writer side: finishing a closed window in the writer process (``pipeline.py``), atomic writes
(``atomic.py``), file names (``layout.py``), the job and result types (``job.py``), and reading
summaries back for the CLI (``report.py``, ``reading.py``). Imports ``analysis`` only, never torch,
so the writer process starts fast."""
