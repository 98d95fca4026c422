"""Directories owned by live processes (pipeline/common/locks.py): what a killed owner leaves is removed by the next
owner; a live owner's is spared."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from pipeline.common.locks import lock_of, owned, scratch_dir
from tests.helpers import ROOT

OWNER = """import sys, time
from pathlib import Path
from pipeline.common.locks import scratch_dir
with scratch_dir(Path(sys.argv[1])) as d:
    (d / "trial.ckpt").write_bytes(b"x" * 1000)
    print(d, flush=True)
    time.sleep(120)
"""


def test_a_killed_trials_scratch_is_removed_by_the_next_and_a_live_ones_spared(tmp_path, request):
    owners = [subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                               text=True) for _ in range(2)]
    for owner in owners:  # killed and reaped: no zombie left for other tests to trip over
        request.addfinalizer(lambda owner=owner: (owner.kill(), owner.wait()))
    killed, live = (Path(owner.stdout.readline().strip()) for owner in owners)
    owners[0].kill()  # SIGKILL: no clean-up code runs
    owners[0].wait()
    assert (killed / "trial.ckpt").exists()
    with scratch_dir(tmp_path) as mine:
        assert not killed.exists() and not lock_of(killed).exists()
        assert (live / "trial.ckpt").exists() and lock_of(live).exists()
        assert mine.is_dir() and mine.parent == tmp_path
    assert not mine.exists() and not lock_of(mine).exists()
    assert owners[1].poll() is None


def test_a_waiting_owner_says_whom_it_waits_for_and_takes_the_lock_once_let_go(tmp_path, capsys):
    lock, held, release = tmp_path / "stores.lock", threading.Event(), threading.Event()

    def holder():
        with owned(lock, "busy"):
            held.set()
            release.wait(30)

    first = threading.Thread(target=holder)
    first.start()
    assert held.wait(30)
    threading.Timer(0.5, release.set).start()
    with owned(lock, "busy", wait=True, waiting="waiting for {holder}"):
        assert release.is_set()
    first.join()
    said = capsys.readouterr().out
    assert said.startswith(f"waiting for pid {os.getpid()} since ") and said.count("\n") == 1
