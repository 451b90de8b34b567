"""Fork safety: a child forked from a training process (``os.fork`` in user code, a
multiprocessing "fork" target, a non-persistent DataLoader worker) did not start the parent's
windows. At the fork its controllers forget them, with no wait, write or removal, so the child's
exit (and any exception or teardown hook Lightning runs in it) finds nothing to finish. Only the
process that started a window finishes it. The tracers stop themselves in the child
(``recording.pytracer`` / ``torchtracer`` / ``rivals`` register their own handlers)."""

from __future__ import annotations

import os
import weakref
from typing import Any

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # WindowControllers alive in this process


def forget_in_forked_children(controller: Any) -> None:
    """Register ``controller`` to be reset in every child forked from now on."""
    _LIVE.add(controller)


def _forget_in_forked_child() -> None:
    for controller in list(_LIVE):
        try:
            triggers = controller.triggers
            if triggers is not None and triggers.signal is not None:
                triggers.signal.restore()  # the child's copy of our handler; the parent keeps its own
            controller.reset(None)
        except BaseException:  # a child must never fail for our sake (a Ctrl-C included)
            pass


os.register_at_fork(after_in_child=_forget_in_forked_child)
