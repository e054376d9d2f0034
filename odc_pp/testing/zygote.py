"""``python -m odc_pp.testing.zygote --nproc-per-node N (-m MODULE | SCRIPT) ARGS...``:
the tests' fast stand-in for ``torchrun --standalone`` on one node.

Why: a tiny end-to-end run spends most of its time importing torch and megatron-core
(about 4 s of CPU per process on this machine, more than ten iterations of the tiny GPT),
and torchrun starts every rank, and itself, from a fresh interpreter. This launcher imports
them once and forks the ranks from that process, so an 8-rank run pays the imports once
instead of nine times; through :mod:`odc_pp.testing.zygote_server` (what the tests use) a
whole test session pays them once.

What a rank sees is what torchrun's worker sees: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``,
``MASTER_ADDR`` / ``MASTER_PORT`` (localhost, a free port: rank 0 hosts the store),
``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT=0``, ``TORCHELASTIC_MAX_RESTARTS=0``,
``OMP_NUM_THREADS`` (1 unless set), ``sys.argv`` and ``__name__ == "__main__"``. A rank ends
like an interpreter's exit (threads joined, atexit handlers run, stdio flushed; not the
module teardown) with the status its entry point returned.

Supervision follows torchrun's: when a rank exits with a non-zero status, the others get
:data:`SETTLE_S` to end, then SIGTERM, then SIGKILL after :data:`GRACE_S`; the launcher
exits 1 and writes a line per failed rank, first failure first ("odc_pp.testing.zygote:
rank R (pid P) exited with code C") to stderr, where torchrun writes its failure report
(:meth:`odc_pp.testing.torchrun.Run.exit_codes` reads either). SIGTERM / SIGINT to the
launcher are forwarded to the ranks.

What it does not do, so the tests of those behaviours run torchrun itself: restarts
(``--max-restarts``), rendezvous across nodes, torchelastic's error files and its failure
report, ``--redirects`` / ``--tee``.

Fork safety: the preloading process holds one thread (checked before forking) and never
runs a torch operation, so no OpenMP pool or lock is copied into a rank.
"""

from __future__ import annotations

import atexit
import importlib
import os
import runpy
import select
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass

from .launch import free_port

__all__ = ["Command", "GRACE_S", "PRELOAD", "SETTLE_S", "main", "parse", "preload", "run"]

SETTLE_S = 1.0
"""Seconds the other ranks get to end on their own after a rank failed (ranks that stop
together, e.g. all on a non-finite loss, then each report their own status)."""
GRACE_S = 10.0
"""Seconds between SIGTERM and SIGKILL for the surviving ranks after a failure."""

PRELOAD = ("torch", "torch.distributed", "odc_pp.training.training", "odc_pp.training.hooks",
           "odc_pp.optim.step")
"""Imported before forking (megatron-core comes with the training modules). Not the entry
modules themselves: ``runpy`` warns when the module it runs is imported already. A module
that fails to import here is left for the rank to import, and to report."""


@dataclass(kw_only=True)
class Command:
    """What to start: ``nproc`` ranks of ``module`` (``-m``) or ``script``, with ``args``."""

    nproc: int
    """Ranks on this node (``--nproc-per-node``)."""
    module: str | None
    """The module run as ``__main__`` (``-m MODULE``), or None for a script."""
    script: str | None
    """The script run as ``__main__``, or None for a module."""
    args: list[str]
    """The entry point's arguments (``sys.argv[1:]``)."""


USAGE = "usage: python -m odc_pp.testing.zygote --nproc-per-node N (-m MODULE | SCRIPT) ARGS..."


def parse(argv: list[str]) -> Command:
    """Launcher options up to the entry point; everything after it is the entry's own
    (torchrun's rule, which argparse's REMAINDER does not follow after ``-m``)."""
    nproc = None
    at = 0
    while at < len(argv) and argv[at].startswith("--nproc"):
        name, _, value = argv[at].partition("=")
        if name not in ("--nproc-per-node", "--nproc_per_node"):
            break
        if not value:
            at += 1
            value = argv[at] if at < len(argv) else ""
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"{USAGE}\n--nproc-per-node must be an integer >= 1, got {value!r}")
        nproc, at = int(value), at + 1
    rest = argv[at:]
    if nproc is None or not rest or (rest[0] == "-m" and len(rest) < 2) \
            or (rest[0].startswith("-") and rest[0] != "-m"):
        raise SystemExit(USAGE)
    if rest[0] == "-m":
        return Command(nproc=nproc, module=rest[1], script=None, args=rest[2:])
    return Command(nproc=nproc, module=None, script=rest[0], args=rest[1:])


def preload() -> None:
    """Import :data:`PRELOAD`; refuse to go on with a second thread or an initialised CUDA
    context (fork safety: a forked rank could not use either)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available(): no CUDA init
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the rank imports it again and reports the error
            pass
    if threading.active_count() != 1:
        raise RuntimeError(f"odc_pp.testing.zygote: {threading.active_count()} threads after "
                           "the imports; forking would copy their locks")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("odc_pp.testing.zygote: CUDA was initialised by the imports; a "
                           "forked rank could not use it")


def _rank_environment(rank: int, world_size: int, port: int, run_id: str) -> dict[str, str]:
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world_size), ROLE_NAME="default",
                MASTER_ADDR="localhost", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=run_id,
                TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")


def _run_rank(command: Command, environment: dict[str, str]) -> int:
    """In the forked child: the entry point as ``__main__``; its exit status."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.update(environment)
    try:
        if command.module is not None:  # (python -m: the working directory first)
            sys.path.insert(0, os.getcwd())
            sys.argv = [command.module, *command.args]
            runpy.run_module(command.module, run_name="__main__", alter_sys=True)
        else:  # (python SCRIPT: the script's directory first)
            sys.path.insert(0, os.path.dirname(os.path.abspath(command.script)))
            sys.argv = [command.script, *command.args]
            runpy.run_path(command.script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, status 1
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _end_rank(code: int) -> None:
    """Leave a forked rank the way the interpreter's exit begins (non-daemon threads and
    executors joined, atexit handlers run, stdio flushed), then ``os._exit``: tearing down
    the modules inherited from the launcher would touch, and so copy, every page of them
    (2-4 s per rank here) for nothing."""
    threading._shutdown()  # what Py_FinalizeEx does first
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stop(pids: dict[int, int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap(pids: dict[int, int], block: bool) -> tuple[int, int] | None:
    """(rank, exit code) of one finished rank, or None (non-blocking, none finished)."""
    pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
    if pid == 0:
        return None
    return pids.pop(pid), os.waitstatus_to_exitcode(status)


def _client_said(watch, forward) -> bool:
    """Signal numbers from a :mod:`odc_pp.testing.zygote_server` client are forwarded;
    False once the client is gone (its end of the connection closed)."""
    ready, _, _ = select.select([watch], [], [], 0.02)
    if not ready:
        return True
    data = watch.recv(256)
    for word in data.split():
        forward(int(word))
    return bool(data)


def _supervise(pids: dict[int, int], watch=None) -> int:
    """Wait for every rank; after a failure give the others :data:`SETTLE_S` to end on
    their own, then stop them; when ``watch`` (a server's client connection) closes, kill
    them. Reports each failed rank; the launcher's exit status."""
    forwarded: list[int] = []

    def forward(number, _frame=None):
        forwarded.append(number)
        _stop(pids, number)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    failed: dict[int, tuple[int, int]] = {}  # rank -> (code, pid), in the order seen
    ranks_pids = {rank: pid for pid, rank in pids.items()}
    stop_at = kill_at = None
    while pids:
        finished = _reap(pids, block=stop_at is None and watch is None)
        now = time.monotonic()
        if finished is None:
            if watch is not None and not _client_said(watch, forward):
                watch, stop_at, kill_at = None, stop_at or now, float("inf")
                _stop(pids, signal.SIGKILL)  # the client was killed: so are its ranks
            elif watch is None:
                time.sleep(0.02)
            if stop_at is not None and kill_at is None and now > stop_at:
                _stop(pids, signal.SIGTERM)
                kill_at = now + GRACE_S
            elif kill_at is not None and now > kill_at:
                _stop(pids, signal.SIGKILL)
                kill_at = float("inf")
            continue
        rank, code = finished
        if code != 0:
            failed[rank] = (code, ranks_pids[rank])
            stop_at = now + SETTLE_S if stop_at is None else stop_at
    for rank, (code, pid) in failed.items():
        print(f"odc_pp.testing.zygote: rank {rank} (pid {pid}) exited with code {code}"
              + (f" (signal {forwarded[0]} was sent to the launcher)" if forwarded else ""),
              file=sys.stderr, flush=True)
    return 1 if failed else 0


def run(command: Command, watch=None) -> int:
    """Fork ``command``'s ranks from this (preloaded) process and supervise them; the
    launcher's exit status. ``watch``: see :func:`_supervise`."""
    port, run_id = free_port(), uuid.uuid4().hex[:12]
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    for rank in range(command.nproc):
        pid = os.fork()
        if pid == 0:
            if watch is not None:
                watch.close()
            _end_rank(_run_rank(command, _rank_environment(rank, command.nproc, port, run_id)))
        pids[pid] = rank
    return _supervise(pids, watch)


def main(argv: list[str] | None = None) -> int:
    command = parse(sys.argv[1:] if argv is None else argv)
    preload()
    return run(command)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # (the launcher's module teardown would take a second, for nothing)
