"""Names shared by every layer, one definition each: file names (docs/files.md), event names,
environment variables, stages. Imports nothing of the package and nothing heavy."""

from __future__ import annotations

import re

VERSION = "0.1.0"  # the package's version (``vt_lightning.__version__``; pyproject reads it here)

# ---------------------------------------------------------------- files of a window (docs/files.md)
# torch-tb-profiler finds traces by this pattern (its own) and compares spans as strings.
TRACE_SUFFIX = ".pt.trace.json.gz"
TRACE_PATTERN = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")
SPAN_WIDTH = 10  # fixed width keeps the plugin's string order equal to batch order
MEMORY_SUFFIX = ".memory_snapshot.pickle"
OOM_MEMORY_SUFFIX = ".oom.memory_snapshot.pickle"
# Not ``*.json``: HTA's directory scan takes every ``*.json`` / ``*.gz`` of a window for a trace.
SUMMARY_JSON_SUFFIX = ".summary.jsonc"
SUMMARY_MD_SUFFIX = ".summary.md"
MEMORY_VIEW_SUFFIX = ".memory_view.jsonc"  # the memory curve and the sites at the peak, drawn by the tab
# What a browser trace viewer loads: above this much JSON the page tends to go blank (the end-of-run
# message and the TensorBoard tab say so, and point to the job file or ``vt-lightning view``).
BROWSER_LIMIT_BYTES = 300 * 1024 * 1024
PICKLE_PROTOCOL = 4  # pytorch.org/memory_viz reads protocols 2..4 only
TRIGGER_FILE_NAME = "vt_lightning.trigger"  # dropped in the output directory, it opens a window
SPOOL_PREFIX = "vt_lightning-spool-"  # scratch directories of raw dumps, one per training process

# ---------------------------------------------------------------- events in a trace
PYTHON_CATEGORY = "FEE"  # VizTracer's category; the plugin leaves it to the Trace view
STEP_PREFIX = "ProfilerStep#"  # torch's step ranges: ``ProfilerStep#<batch>``
PL_PREFIX = "[pl]"
PL_MODULE_PREFIX = "[pl][module]"  # the Lightning view's module ranges
PL_PROFILE_PREFIX = "[pl][profile]"  # Lightning's stage ranges (training_step, validation, ...)
FRAMEWORK_KEY = "Framework"
FRAMEWORK_LIGHTNING = "pytorch-lightning"
CPU_OP_CATEGORY = "cpu_op"
USER_ANNOTATION_CATEGORY = "user_annotation"
CLOCK_MARKER_PREFIX = "vt_lightning::clock"  # torch ranges bracketing clock reads, removed at merge
TRACE_METADATA_KEY = "vt_lightning"  # our metadata block in a merged trace
UNTRACED_WAIT_KEY = "untraced_data_wait"  # in it: the untraced steps' data wait (controller/data_wait.py)
COMMAND_FUNCTIONS_KEY = "command_functions"  # in it: a `python -c` command's own functions (analysis/usercode.py)
# Ranges written as ``cpu_op`` that are annotations, not ops: not nested like ops at merge, never in
# the op tables or the verdicts' op time.
ANNOTATION_PREFIXES = (PL_PREFIX, STEP_PREFIX, CLOCK_MARKER_PREFIX)
GC_SPAN_PREFIX = "[gc] "  # recording/gc_watch.py names its spans "[gc] generation N"

# ---------------------------------------------------------------- environment and process names
ENV_SWITCH = "VT_LIGHTNING"  # =1 adds the callback to every Trainer
ENV_PREFIX = "VT_LIGHTNING_"  # VT_LIGHTNING_<OPTION> sets an option of that callback
ENV_COMMAND_PREFIX = "VT_LIGHTNING_CMD"  # options of the ``vt-lightning`` command
KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
THREAD_PREFIX = "vt_lightning"  # our own threads' names start with it (never traced)
LOGGER_NAME = "vt_lightning"

# ---------------------------------------------------------------- defaults several layers state
WRITER_TIMEOUT_S = 60.0  # the ``writer_timeout`` option's default (options, callback, hand-off)

# ---------------------------------------------------------------- stages
STAGES = ("fit", "validate", "test", "predict")
