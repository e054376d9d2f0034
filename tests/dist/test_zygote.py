"""The tests' fast launcher (odc_pp.testing.zygote, alone and through its server) against
torchrun itself: the same worker environment, a gloo group over it, a rank's failure
stopping the others and the launcher exiting 1 with each failed rank named; a killed client
takes its ranks with it."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from odc_pp.testing.torchrun import ROOT, _zygote_server

pytestmark = pytest.mark.multiproc

# torchrun's worker variables that a training entry point may read
NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
         "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    if sys.argv[1] in ("fail", "sleep"):
        with open(f"{sys.argv[2]}.pid.{os.environ['RANK']}", "w") as out:
            out.write(str(os.getpid()))
        if sys.argv[1] == "fail" and os.environ["RANK"] == "1":
            sys.exit(3)
        import time; time.sleep(120)
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    record = {name: os.environ.get(name) for name in sys.argv[3].split(",")}
    record.update(total=total.item(), main=__name__, argv=sys.argv[1:2],
                  run_id=bool(os.environ.get("TORCHELASTIC_RUN_ID")),
                  port=bool(os.environ.get("MASTER_PORT")))
    with open(f"{sys.argv[2]}.{dist.get_rank()}", "w") as out:
        json.dump(record, out)
    dist.destroy_process_group()
""")


ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1",
       "PYTHONWARNINGS": "ignore"}


def _command(launcher: list[str], script, mode: str, out) -> list[str]:
    return [sys.executable, "-m", *launcher, "--nproc-per-node", "2", str(script), mode,
            str(out), ",".join(NAMES)]


def _run(launcher: list[str], script, mode: str, out, timeout=120):
    started = time.monotonic()
    done = subprocess.run(_command(launcher, script, mode, out), cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=ENV)
    return done, time.monotonic() - started


def _launchers() -> dict[str, list[str]]:
    return {"zygote": ["odc_pp.testing.zygote"],
            "server": ["odc_pp.testing.zygote_server", "launch", _zygote_server(ENV)],
            "torchrun": ["torch.distributed.run", "--standalone"]}


def test_ranks_see_torchruns_environment(tmp_path):
    script = tmp_path / "entry.py"
    script.write_text(SCRIPT)
    records = {}
    for name, launcher in _launchers().items():
        done, _ = _run(launcher, script, "ok", tmp_path / name)
        assert done.returncode == 0, (name, done.stderr[-3000:])
        records[name] = [json.loads((tmp_path / f"{name}.{rank}").read_text())
                         for rank in range(2)]
    for name in ("zygote", "server"):
        differ = {(rank, key): (mine[key], theirs.get(key))
                  for rank, (mine, theirs) in enumerate(zip(records[name], records["torchrun"]))
                  for key in mine if mine[key] != theirs.get(key)}
        assert not differ, (name, differ)
    assert [r["RANK"] for r in records["zygote"]] == ["0", "1"]
    assert all(r["total"] == 1.0 and r["main"] == "__main__" and r["run_id"] and r["port"]
               for r in records["zygote"])


@pytest.mark.parametrize("name", ["zygote", "server"])
def test_a_failed_rank_stops_the_others_and_is_named(tmp_path, name):
    script = tmp_path / "entry.py"
    script.write_text(SCRIPT)
    done, seconds = _run(_launchers()[name], script, "fail", tmp_path / "x")
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line.split(" exited with code ") for line in done.stderr.splitlines()
             if line.startswith("odc_pp.testing.zygote: rank ")]
    assert [code for _, code in lines] == ["3", "-15"], done.stderr[-3000:]  # 0: SIGTERM
    assert lines[0][0].startswith("odc_pp.testing.zygote: rank 1 (pid")
    assert seconds < 60  # rank 0 (asleep for 120 s) was stopped, not waited for


def test_a_killed_client_takes_its_ranks_with_it(tmp_path):
    script = tmp_path / "entry.py"
    script.write_text(SCRIPT)
    out = tmp_path / "x"
    client = subprocess.Popen(_command(_launchers()["server"], script, "sleep", out), cwd=ROOT,
                              env=ENV)
    deadline = time.monotonic() + 60
    pids = []
    while len(pids) < 2:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)
        pids = [int(p.read_text()) for p in tmp_path.glob("x.pid.*") if p.read_text()]
    client.kill()
    client.wait()
    for pid in pids:
        while _alive(pid):
            assert time.monotonic() < deadline, f"rank pid {pid} outlived its client"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_bad_usage_exits_with_the_usage():
    done = subprocess.run([sys.executable, "-m", "odc_pp.testing.zygote", "-m"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "--nproc-per-node N" in done.stderr
