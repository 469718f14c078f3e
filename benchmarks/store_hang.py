"""How long a c10d TCPStore client waits on a server that answers nothing without closing
its socket (a host whose link went away; here the server's process is stopped with
SIGSTOP), against the timeout it was given: why hetbench bounds every store call itself
(harness/run/nodes.py, `_within`).

    python benchmarks/store_hang.py [--timeout-s 3] [--give-up-s 40]

Each operation runs in a process of its own, ended after --give-up-s; prints one line per
operation: how it ended and after how long.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

SERVER = """
import datetime, sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, True, datetime.timedelta(seconds=60),
                      wait_for_workers=False)
print("serving", flush=True)
time.sleep(3600)
"""

CLIENT = """
import datetime, sys, time
import torch.distributed as dist
port, timeout_s, operation = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
store = dist.TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=timeout_s))
store.set("a", "1")
print("joined", flush=True)
sys.stdin.readline()  # the server is stopped now
operations = {"check": lambda: store.check(["a"]), "get": lambda: store.get("a"),
              "set": lambda: store.set("b", b"x" * 1_000_000),
              "multi_get": lambda: store.multi_get(["a"])}
began = time.monotonic()
try:
    operations[operation]()
    print(f"returned after {time.monotonic() - began:.1f} s", flush=True)
except Exception as exc:
    print(f"raised {type(exc).__name__} after {time.monotonic() - began:.1f} s", flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(operation: str, timeout_s: float, give_up_s: float) -> str:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE,
                              text=True)
    client = None
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "serving"
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(port), str(timeout_s),
                                   operation], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "joined"
        os.kill(server.pid, signal.SIGSTOP)
        client.stdin.write("go\n")
        client.stdin.flush()
        try:
            out, _ = client.communicate(timeout=give_up_s)
            return out.strip()
        except subprocess.TimeoutExpired:
            return f"still waiting after {give_up_s:g} s"
    finally:
        for proc in (client, server):
            if proc is not None:
                proc.kill()
                proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout-s", type=float, default=3.0, help="the store's timeout")
    parser.add_argument("--give-up-s", type=float, default=40.0,
                        help="how long to wait for an operation before calling it hung")
    args = parser.parse_args()
    for operation in ("check", "get", "set", "multi_get"):
        began = time.monotonic()
        result = one(operation, args.timeout_s, args.give_up_s)
        print(f"{operation:<9} (timeout {args.timeout_s:g} s): {result} "
              f"[{time.monotonic() - began:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
