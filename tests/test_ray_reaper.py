"""The embedded Ray's reaper (parallel/ray_reaper.py) finds a Ray process by its owner mark once its parent died
(adopted by init, nobody's descendant), and ends it; without the mark, only descendants are found."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tp_runtime.parallel import ray_reaper


def _orphan(code_dir: Path, owner: str) -> int:
    """A sleeping process whose command line lies inside code_dir (a Ray process by ray_reaper.is_ray), marked
    with owner, whose parent has exited: its pid."""
    script = code_dir / "agent.py"
    script.write_text("import time\ntime.sleep(60)\n")
    pid_file = code_dir / "pid"
    spawn = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, {str(script)!r}], "
             f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(p.pid))")
    env = {**os.environ, ray_reaper.OWNER_ENV: owner}
    subprocess.run([sys.executable, "-c", spawn], env=env, check=True, timeout=30)
    return int(pid_file.read_text())


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_owner_mark_finds_an_orphaned_ray_process(tmp_path: Path) -> None:
    code_dir = tmp_path / "ray"
    code_dir.mkdir()
    owner = uuid.uuid4().hex
    pid = _orphan(code_dir, owner)
    try:
        assert ray_reaper.stat(pid)[0] != os.getpid()  # not this process's child: its parent has exited
        seen: dict[int, str] = {}
        ray_reaper.look(os.getpid(), str(code_dir) + os.sep, seen)  # descendants only: not found
        assert pid not in seen
        ray_reaper.look(os.getpid(), str(code_dir) + os.sep, seen, uuid.uuid4().hex)  # another Ray's mark
        assert pid not in seen
        assert ray_reaper.look(os.getpid(), str(code_dir) + os.sep, seen, owner) == 1 and pid in seen
        ray_reaper.kill_seen(seen)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, 9)
