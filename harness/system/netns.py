"""A private network namespace for a run's workers: the loopback interface and nothing
else, so that a listener bound to every interface is still reachable from this host only.

TensorFlow's gRPC servers bind "0.0.0.0:<port>" whatever address they are given, with no
setting for it (issue 18); inside such a namespace "every interface" is `lo`. The launcher
starts a holder (`python -m hetbench.harness.system.netns hold`) that creates the namespace (a user
namespace too when not root, as `unshare -Urn` does), brings `lo` up and waits; each worker
is started as `python -m hetbench.harness.system.netns join PID -- COMMAND`, which enters the
holder's namespaces and then becomes COMMAND (exec: same pid, nothing left between). The holder ends
when the launcher stops it or dies (its stdin closes), and on its way out it ends every process
still in the namespace: a daemon a user's factory or script forked (a new session, its stdio
closed or kept) leaves the process group but never the namespace, so nothing a run started
outlives it (`end_members`). The job check runs in a namespace of its own the same way.

Linux only; where namespaces are not allowed (a container without the capability, a
kernel with unprivileged user namespaces off) `start_holder` says why and the run goes on
in the host's network.
This module imports no framework: the launcher and the joiner use it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
READY = b"ready\n"
START_TIMEOUT_S = 20.0
LEFT_GRACE_S = 2.0  # for what a run left in its namespace to end on SIGTERM
LEFT_ROUNDS = 5  # sweeps of the namespace (a daemon may fork while it is swept)
STOP_WAIT_S = 2 * LEFT_GRACE_S * LEFT_ROUNDS + 5.0  # the holder's own way out, bounded


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _create(user: bool) -> None:
    """This (single-threaded) process moves to a new network namespace, in a new user
    namespace where it is root when `user` (what an unprivileged process needs)."""
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc().unshare(CLONE_NEWNET | (CLONE_NEWUSER if user else 0)), "unshare")
    if user:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def loopback_up() -> None:
    """Bring `lo` up (a new namespace has it down): the flags through ioctl, as `ip link set
    lo up` does, without needing iproute2."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def isolate() -> str | None:
    """This (single-threaded) process alone in a namespace whose only interface is `lo`:
    nothing it starts reaches the network. None, or why not (namespaces not allowed)."""
    try:
        _create(user=os.geteuid() != 0)
        loopback_up()
    except OSError as exc:
        return str(exc)
    return None


def hold() -> int:
    """Create the namespace, say ready on stdout, and keep it until stdin closes."""
    if (why := isolate()) is not None:
        print(f"no private network namespace: {why}", file=sys.stderr, flush=True)
        return 1
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    sys.stdin.buffer.read()  # returns at EOF: the launcher closed it, or died
    if ended := end_members():
        print(f"ended {len(ended)} process(es) left in the namespace: "
              f"{', '.join(map(str, ended))}", file=sys.stderr, flush=True)
    return 0


def members(namespace_id: str) -> list[int]:
    """Every process but this one in the network namespace `namespace_id` (as `namespace`
    names it), from /proc; a process that ends meanwhile, or that may not be looked at (another
    user's), is left out."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/net") == namespace_id:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def end_members(grace_s: float = LEFT_GRACE_S, rounds: int = LEFT_ROUNDS) -> list[int]:
    """In the holder, once the run is over: every other process still in its namespace gets
    SIGTERM, then SIGKILL after `grace_s`; swept again (up to `rounds` times) for what was
    forked meanwhile. Returns the pids it signalled."""
    mine, ended = namespace(), []
    for _ in range(rounds):
        left = members(mine)
        if not left:
            break
        ended += left
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in left:
                _signal(pid, sig)
            deadline = time.monotonic() + grace_s
            while (left := [p for p in left if _living(p)]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not left:
                break
    return sorted(set(ended))


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _living(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, ended and waiting for its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def join(pid: int) -> None:
    """Enter the network namespace of holder `pid` (and first its user namespace, when it
    made one: this process must still be single-threaded)."""
    libc = _libc()
    for kind, flag in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
        theirs = f"/proc/{pid}/ns/{kind}"
        if os.readlink(theirs) == os.readlink(f"/proc/self/ns/{kind}"):
            continue
        fd = os.open(theirs, os.O_RDONLY)
        try:
            _check(libc.setns(fd, flag), f"setns into {theirs}")
        finally:
            os.close(fd)


def namespace(pid: int | str = "self") -> str:
    """The network namespace of a process, as /proc names it ("net:[4026531840]")."""
    return os.readlink(f"/proc/{pid}/ns/net")


def interfaces(pid: int | str = "self") -> list[str]:
    """The network interfaces a process sees (its namespace's), from /proc/PID/net/dev."""
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def start_holder(log: Path) -> subprocess.Popen[bytes] | str:
    """The holder process, once its namespace is ready; else why not (its log's words)."""
    with open(log, "wb") as err:
        holder = subprocess.Popen([sys.executable, "-m", "hetbench.harness.system.netns", "hold"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                  start_new_session=True)
    assert holder.stdout is not None
    # the holder writes READY or exits: a blocking read would end either way; bounded anyway
    with selectors.DefaultSelector() as wait:
        wait.register(holder.stdout, selectors.EVENT_READ)
        answered = bool(wait.select(timeout=START_TIMEOUT_S))
    if answered and holder.stdout.readline() == READY:
        return holder
    stop_holder(holder)
    why = log.read_text(errors="replace").strip().splitlines()
    return why[-1] if why else f"the holder did not answer in {START_TIMEOUT_S:.0f} s"


def stop_holder(holder: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it ends what is left in the namespace, and exits), kill it if it does
    not."""
    if holder.stdin is not None:
        holder.stdin.close()
    try:
        holder.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
    if holder.stdout is not None:
        holder.stdout.close()


def join_command(pid: int, command: list[str], safe_path: bool = False) -> list[str]:
    """`command`, run inside the namespace of holder `pid`; `safe_path`: the joiner's
    Python without the working folder on its import path (python -P: a user's project
    folder whose own modules would shadow the ones it imports)."""
    return [sys.executable, *(["-P"] if safe_path else []), "-m",
            "hetbench.harness.system.netns", "join", str(pid), "--", *command]


def main(argv: list[str]) -> int:
    if argv[:1] == ["hold"]:
        return hold()
    if len(argv) >= 4 and argv[0] == "join" and argv[2] == "--":
        try:
            join(int(argv[1]))
        except OSError as exc:
            print(f"hetbench: error: cannot enter the run's network namespace: {exc}",
                  file=sys.stderr)
            return 1
        os.execv(argv[3], argv[3:])
    print("usage: python -m hetbench.harness.system.netns hold | join PID -- COMMAND...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
