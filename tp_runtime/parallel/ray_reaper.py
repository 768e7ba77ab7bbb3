"""The embedded Ray's reaper: ends every process of an embedded Ray that outlives it.

    python -m tp_runtime.parallel.ray_reaper DRIVER_PID RAY_INIT_FILE OWNER   # stdin: a pipe from the driver

Ray's own fate sharing ends the GCS, raylet and workers when the driver dies (SIGKILL), but its
DashboardAgent and RuntimeEnvAgent first report the raylet's death to the dead GCS, with a fixed 60 s
timeout; and a ray.init interrupted half-way (SIGINT, SIGTERM) leaves ray.shutdown() nothing to stop.
The reaper notes the processes of this Ray (by name, or by a command line inside the ray package, whose
`__init__.py` is RAY_INIT_FILE; pid and start time, from /proc) twice a second while its stdin pipe from the
driver is open: the driver's descendants, and every process whose environment holds OWNER_ENV=OWNER, which
the driver set before ray.init and Ray's processes inherit. The mark finds a process whose parent died before
it was noted (an agent of a raylet that a signal to the process group ended: adopted by init, it is nobody's
descendant, and it waits out its 60 s). At EOF (the driver stopped Ray, failed to start it, or died) it looks
once more and SIGKILLs those that still exist, until a look finds no new one.

ray_launch.EmbeddedRay starts it in a session of its own, with SIGINT / SIGTERM / SIGHUP ignored: a signal to
the command's process group (a terminal's Ctrl-C or hang-up) ends the driver, never the reaper that cleans
up after it. It imports nothing but the standard library (not Ray, not torch), so it
is up and watching before ray.init starts anything.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Iterable

RAY_NAMES = ("ray::", "raylet", "gcs_server")  # Ray's processes; the driver's other children are left alone
OWNER_ENV = "TP_RUNTIME_RAY_OWNER"  # the mark of one embedded Ray's processes (their driver's environment)
LOOK_EVERY_S = 0.5
FINAL_LOOKS = 10  # at EOF: kill and look again while new Ray processes keep appearing, at most this often


def stat(pid: int | str) -> tuple[int, str, str]:
    """(parent pid, start time, name) of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    rest = text.rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses: split after its last ')'
    return int(rest[1]), rest[19], text[text.index("(") + 1:text.rindex(")")]


def is_ray(pid: int, name: str, ray_code: str) -> bool:
    """A process of Ray's: by its name, or by a command-line argument inside the ray package (`ray_code`):
    its log monitor, agents and reaper run as plain python."""
    if name.startswith(RAY_NAMES):
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return any(a.startswith(ray_code) for a in f.read().decode(errors="replace").split("\0"))
    except OSError:
        return False


def processes() -> dict[int, tuple[int, str, str]]:
    """Every live process but this one: pid -> (parent pid, start time, name)."""
    procs = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(d) != os.getpid():
                procs[int(d)] = stat(d)
        except (OSError, IndexError, ValueError):  # ended while being read
            pass
    return procs


def descendants(driver: int, procs: dict[int, tuple[int, str, str]]) -> set[int]:
    """The descendants of `driver` among procs (`processes()`)."""
    kids, todo = set(), [driver]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _, _) in procs.items():
            if ppid == parent and pid not in kids:
                kids.add(pid)
                todo.append(pid)
    return kids


def marked(owner: str, pids: Iterable[int]) -> set[int]:
    """The processes among pids whose environment holds OWNER_ENV=owner."""
    needle = f"{OWNER_ENV}={owner}".encode()
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.add(pid)
        except OSError:  # ended since, or not this user's
            pass
    return out


def look(driver: int, ray_code: str, seen: dict[int, str], owner: str = "") -> int:
    """Note the Ray processes of the driver's (its descendants, and those marked with `owner`) not yet in `seen`
    (pid -> start time); how many were new. One walk of /proc; the environments read are those of the processes
    neither seen nor descendants (a look every half second need not reread the same files)."""
    procs = processes()
    found = descendants(driver, procs)
    if owner:
        found |= marked(owner, procs.keys() - found - seen.keys())
    new = 0
    for pid in found - {driver}:
        _, start, name = procs[pid]
        if pid not in seen and is_ray(pid, name, ray_code):
            seen[pid], new = start, new + 1
    return new


def kill_seen(seen: dict[int, str]) -> None:
    """SIGKILL every noted process that still exists (the same process, not a reused pid)."""
    for pid, start in list(seen.items()):
        try:
            if stat(pid)[1] == start:
                os.kill(pid, signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            pass


def reap(driver: int, ray_code: str, owner: str = "") -> None:
    """Watch while stdin is open; at EOF end every Ray process of the driver's that is still there."""
    seen: dict[int, str] = {}
    while not select.select([sys.stdin], [], [], LOOK_EVERY_S)[0]:
        look(driver, ray_code, seen, owner)
    sys.stdin.read()
    for _ in range(FINAL_LOOKS):
        look(driver, ray_code, seen, owner)
        kill_seen(seen)
        if not look(driver, ray_code, seen, owner):
            break


def main(argv: list[str]) -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # its driver's signals are not its own
        signal.signal(s, signal.SIG_IGN)
    driver, ray_init, owner = argv
    reap(int(driver), os.path.dirname(ray_init) + os.sep, owner)


if __name__ == "__main__":
    main(sys.argv[1:])
