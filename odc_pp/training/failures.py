"""How a failing rank leaves, so that torchrun names the rank that holds the real error.

torchrun's "Root Cause (first observed failure)" is the failed rank with the smallest
timestamp: the one in the rank's torchelastic error file (``TORCHELASTIC_ERROR_FILE``) if
the rank wrote it, otherwise the second at which torchrun saw the exit. Under gloo, one
rank's own error makes every peer fail within milliseconds ("Connection closed by peer"),
so all exits land in one monitor poll with one timestamp and torchrun names the lowest
rank, which only holds the echo.

Contract of :func:`exit_after_failure`:

* **own failure** (anything not caused by a peer, including our timeouts, which name the
  stalled peer): write the error file (message, traceback, timestamp) and exit at once;
* **echo of a peer's failure** (the transport reports the connection closed or reset by a
  peer): write no error file and exit after ``PEER_ECHO_GRACE_S`` seconds, so torchrun
  observes the originating rank first and stops the rest itself.
"""

from __future__ import annotations

import os
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

__all__ = ["PEER_ECHO_GRACE_S", "exit_after_failure", "is_peer_echo", "at_failure_exit"]

PEER_ECHO_GRACE_S = 3.0
"""How long a rank whose failure only echoes a peer's waits before it exits (seconds);
well above torchrun's default monitor interval (0.1 s)."""

_AT_EXIT: list = []


def at_failure_exit(callback) -> None:
    """Run ``callback()`` in :func:`exit_after_failure` before the process leaves (for
    what a failed run must not leave held, e.g. the ``--save`` lock; it must be harmless
    when the resource is already gone); its errors are ignored."""
    _AT_EXIT.append(callback)


_PEER_ECHO_MARKERS = ("closed by peer", "reset by peer", "connection closed",
                      "connection reset", "broken pipe")


def is_peer_echo(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) says a peer went away."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (ConnectionError, BrokenPipeError)):
            return True
        text = str(exc).lower()
        if any(marker in text for marker in _PEER_ECHO_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def exit_after_failure(exc: BaseException, code: int, *, grace_s: float = PEER_ECHO_GRACE_S
                       ) -> None:
    """Leave the process with ``code`` (never returns); call it from the ``except`` block.

    An own failure is recorded in the torchelastic error file and exits now; an echo of a
    peer's failure exits after ``grace_s`` without an error file (see the module contract).
    """
    for callback in list(_AT_EXIT):
        try:
            callback()
        except Exception:  # leaving anyway: a cleanup must not hide the real error
            pass
    if is_peer_echo(exc):
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(grace_s)
    else:
        ErrorHandler().record_exception(exc)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
