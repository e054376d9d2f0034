"""One preloaded zygote for a whole test session: ``python -m odc_pp.testing.zygote_server
serve SOCKET`` imports :data:`odc_pp.testing.zygote.PRELOAD` once, then serves launches;
``python -m odc_pp.testing.zygote_server launch SOCKET --nproc-per-node N (-m MODULE |
SCRIPT) ARGS...`` is a launch (the arguments of :mod:`odc_pp.testing.zygote`).

A launch is a small client process (no torch import) that hands the server its command
line, working directory, environment and its stdin / stdout / stderr (passed as file
descriptors over the Unix socket). The server forks a launcher for it, which takes those
descriptors, directory and environment and runs :func:`odc_pp.testing.zygote.run`: the
ranks write straight to the client's pipes. The launcher sends the exit status back; the
client exits with it. Signals to the client (SIGTERM, SIGINT) are forwarded to the ranks,
and a client that dies (a test's timeout kills its process group) takes its ranks with it:
the launcher sees the connection close and SIGKILLs them.

The server ends when its stdin closes (the process that started it is gone). It never
runs a torch operation and holds one thread, so every fork starts from the same clean
state (:func:`odc_pp.testing.zygote.preload` checks the threads).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

from .zygote import parse, preload, run

__all__ = ["main", "request", "serve"]

_HEADER = 10
"""Digits of the request's length prefix."""
REQUEST_TIMEOUT_S = 30.0
"""Longest the server waits for a connected client's whole request."""


def request(path: str, argv: list[str]) -> int:
    """The client: one launch of ``argv`` (the zygote's arguments) by the server at
    ``path``; the launch's exit status."""
    parse(argv)  # bad usage fails here, in the client's own stderr
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    payload = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [f"{len(payload):0{_HEADER}d}".encode() + payload], [0, 1, 2])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _frame: conn.sendall(f"{number}\n".encode()))
    answer = b""
    while not answer.endswith(b"\n"):
        data = conn.recv(64)
        if not data:
            print("odc_pp.testing.zygote: the server closed the launch without a status",
                  file=sys.stderr, flush=True)
            return 1
        answer += data
    return int(answer)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = int(data[:_HEADER])
    while len(data) < _HEADER + size:
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("the client left in the middle of its request")
        data += more
    return json.loads(data[_HEADER:_HEADER + size]), fds


def _launch(conn: socket.socket, message: dict, fds: list[int]) -> None:
    """In the forked launcher: become the client's process, run its ranks, answer."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(message["cwd"])
    os.environ.clear()
    os.environ.update(message["env"])
    status = 1
    try:
        status = run(parse(message["argv"]), watch=conn)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.sendall(f"{status}\n".encode())
        except OSError:  # the client is gone
            pass
        os._exit(0)


def _reap_launchers() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(path: str) -> None:
    """Preload, listen at ``path``, fork a launcher per client until stdin closes."""
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [], 1.0)
            _reap_launchers()
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1024):
                return
            if listener not in ready:
                continue
            conn, _ = listener.accept()
            conn.settimeout(REQUEST_TIMEOUT_S)  # a client that never finishes its request
            try:
                message, fds = _receive(conn)
                conn.settimeout(None)
            except (OSError, ValueError) as exc:
                print(f"odc_pp.testing.zygote_server: a bad request ({exc})", file=sys.stderr,
                      flush=True)
                conn.close()
                continue
            if os.fork() == 0:
                listener.close()
                _launch(conn, message, fds)
            conn.close()
            for fd in fds:
                os.close(fd)
    finally:
        listener.close()
        if os.path.exists(path):  # (its directory may be gone with the starting process)
            os.unlink(path)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1])
        return 0
    if len(argv) >= 2 and argv[0] == "launch":
        return request(argv[1], argv[2:])
    print("usage: python -m odc_pp.testing.zygote_server (serve SOCKET | launch SOCKET "
          "--nproc-per-node N (-m MODULE | SCRIPT) ARGS...)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # (no module teardown: seconds for the server, nothing for a client)
