"""The hosts of one launch across hosts (`hetbench run --nnodes N`), joined through
torch.distributed's rendezvous: a c10d TCPStore on the master's address, served by node
0's launcher (under torchrun, by its agent), every launcher a client. The launchers run
the suite's runs in lockstep through it; the workers of each run meet in a rendezvous of
their own (rank 0 serves it).

What the launchers keep in the store (node 0 serves a new one for each launch):

    suite/<k>               node k's digest of the suite (compared when they join)
    beat/<k>                node k's heartbeat: a counter its launcher raises every BEAT_S
    run/<i>/start           node 0: the run's directory name, the workers' and the services'
                            rendezvous ports
    run/<i>/abort           why the run fails, from the first node that saw it fail
    run/<i>/done/<k>        node k: how its workers ended, and the names of its files
    run/<i>/file/<k>/<name> node k's flushed parts and logs, for node 0's run directory
    stop                    a node was stopped (Ctrl-C, SIGTERM): the suite stops everywhere

A node that stops answering (no heartbeat for STALE_S) fails the run it was in; node 0
gone ends the suite on every other node (NodeLost). Every store operation is bounded
(STORE_CALL_S, `_within`), and so is a run's closing (`close_deadline_s`): a host whose
link went away answers nothing and closes no socket, and c10d's client then waits far past
its own timeout, which would hold a launcher for good.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from hetbench.harness.records import collector, jsonfile
from hetbench.harness.records.rundir import RUN_FILE, RunResult, close_run
from hetbench.harness.spec.errors import NodeLost, UsageError
from hetbench.harness.spec.suite import RunSpec, SuiteSpec
from hetbench.harness.system import interfaces, procfs, services

BEAT_S = 0.5
STALE_S = 5.0  # no heartbeat for this long: the node stopped answering
POLL_S = 0.1
# one store operation at most this long (a file handed over: until the closing's
# deadline, however slow the link), and a run's closing across hosts at most its
# timeout_s + CLOSE_MARGIN_S
STORE_CALL_S = 2 * STALE_S
CLOSE_MARGIN_S = 30.0
# the files a node sends to node 0: its workers' parts and logs, nothing else
SENT_FILE = re.compile(r"(parts|logs)/[A-Za-z0-9_.-]+")
STORE_PREFIX = "hetbench"  # the launchers' keys in torchrun's agent's store


@dataclass(frozen=True)
class Place:
    """Where this launcher stands among the hosts (torchrun's names)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    join_timeout_s: float
    # under torchrun: its agent on node 0 serves the store at master_addr:master_port, and
    # every launcher is a client of it (the launchers' keys under STORE_PREFIX)
    agent_store: bool = False

    @property
    def coordinator(self) -> bool:
        return self.node_rank == 0


class StoreSilent(RuntimeError):
    """A store call got no answer in time (on node 0: the launch's own store)."""


class StoppedElsewhere(KeyboardInterrupt):
    """Another host's launcher was stopped (Ctrl-C, SIGTERM): this one stops the suite too,
    as if it had been (exit status 130; the reason names the node)."""


def suite_digest(suite: SuiteSpec) -> str:
    """What every host must agree on: the suite as it will run (after --steps, --repeats
    and -k), not its file's bytes."""
    text = json.dumps({"name": suite.name, "repeats": suite.repeats,
                       "runs": [r.to_dict() for r in suite.runs]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _torch_distributed() -> Any:
    """torch.distributed, loaded with c10d's C++ log quiet: a node that does not answer
    is one line of ours, not pages of retries (the level is read once, at load)."""
    before = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch.distributed as dist
    finally:
        if before is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = before
    return dist


class Nodes:
    """This launcher's view of the others: join, lockstep keys, heartbeats, liveness."""

    def __init__(self, place: Place, store: Any, beats: Any) -> None:
        self.place, self.store = place, store
        # this host's address towards node 0, and the interface holding it: what the
        # workers bind when the run names no `interface`
        self.address = interfaces.address_towards(place.master_addr, place.master_port)
        self.interface = interfaces.holding(self.address) or "lo"
        # every node: its host name, address and link (as the suite describes it, and
        # whether its launcher could shape it)
        self.hosts: list[dict[str, Any]] = []
        self.lost: set[int] = set()  # nodes that stopped answering (node 0 keeps this)
        self._unanswered: str | None = None  # why the store is given up on (a call timed out)
        self._beats_store = beats
        self._seen: dict[int, tuple[int, float]] = {}  # node -> (beat, when it changed)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hetbench-heartbeat",
                                        daemon=True)

    @classmethod
    def join(cls, place: Place, digest: str, link: dict[str, Any] | None = None) -> Nodes:
        """Meet the other hosts, or one line (UsageError) naming what did not answer or
        what differs, before anything runs."""
        dist = _torch_distributed()
        from hetbench.harness.exchange.rendezvous import tcp_store

        where = f"{place.master_addr}:{place.master_port}"
        timeout = timedelta(seconds=place.join_timeout_s)
        try:
            if place.agent_store:
                store = dist.PrefixStore(STORE_PREFIX, dist.TCPStore(
                    place.master_addr, place.master_port, None, False, timeout))
            else:
                store = tcp_store(place.master_addr, place.master_port, place.node_rank,
                                  place.nnodes, timeout)
        except OSError as exc:  # node 0 cannot listen there
            raise UsageError("--master-addr", f"cannot listen on {where}: {exc.strerror or exc}"
                             " (node 0's own address, and a free port)") from None
        except dist.DistError as exc:
            if place.coordinator:
                raise UsageError("--nnodes", f"{place.nnodes} nodes, but not all joined at "
                                 f"{where} within {place.join_timeout_s:g} s "
                                 f"({_first_line(exc)})") from None
            raise UsageError("--master-addr", f"no hetbench run of node 0 answered at {where} "
                             f"within {place.join_timeout_s:g} s") from None
        beats = dist.TCPStore(place.master_addr, place.master_port, None, False, timeout)
        if place.agent_store:
            beats = dist.PrefixStore(STORE_PREFIX, beats)
        nodes = cls(place, store, beats)
        store.set(f"beat/{place.node_rank}", "0")
        from torch.distributed.elastic.utils.store import synchronize

        mine = {"digest": digest, "host": socket.gethostname(), "address": nodes.address,
                **(link or {"link": {}, "link_applied": False})}
        joined = [json.loads(raw) for raw in synchronize(
            store, json.dumps(mine).encode(), place.node_rank, place.nnodes, "suite/",
            timeout=place.join_timeout_s)]
        nodes.hosts = [{"node": k, "host": j["host"], "address": j["address"],
                        "link": j["link"], "link_applied": j["link_applied"]}
                       for k, j in enumerate(joined)]
        for k, theirs in enumerate(j["digest"] for j in joined):
            if theirs != digest:
                raise UsageError("suite", f"node {k}'s suite (digest {theirs[:12]}) differs "
                                 f"from this host's ({digest[:12]}): run the same suite file, "
                                 "with the same --steps, --repeats and -k, on every host")
        nodes._thread.start()
        return nodes

    # -- liveness ---------------------------------------------------------------------------

    def _beat(self) -> None:
        count = 0
        while not self._stopping.wait(BEAT_S):
            count += 1
            try:
                self._beats_store.set(f"beat/{self.place.node_rank}", str(count))
            except Exception:  # noqa: BLE001 - node 0 gone: the main thread will see it
                return

    def silent(self) -> list[int]:
        """The nodes this one watches (every other, on node 0; node 0, elsewhere) whose
        heartbeat has not moved for STALE_S. Raises NodeLost when node 0 is gone."""
        watched = [k for k in range(self.place.nnodes) if k != self.place.node_rank] \
            if self.place.coordinator else [0]
        now = time.monotonic()
        beats = self._call(lambda: self.store.multi_get([f"beat/{k}" for k in watched]))
        silent = []
        for k, raw in zip(watched, beats, strict=True):
            beat = int(raw)
            last = self._seen.get(k)
            if last is None or last[0] != beat:
                self._seen[k] = (beat, now)
            elif now - last[1] > STALE_S:
                silent.append(k)
        if silent and not self.place.coordinator:
            raise NodeLost(f"node 0 ({self.place.master_addr}) stopped answering (no "
                           f"heartbeat for {STALE_S:g} s)")
        return silent

    def _call(self, op: Any, within_s: float | None = None) -> Any:
        """A store operation, at most `within_s` (default STORE_CALL_S); node 0 gone (its
        server with it), or silent, is NodeLost."""
        if self._unanswered is not None:  # a call still waits in the socket: no other
            raise NodeLost(self._unanswered)
        try:
            return _within(STORE_CALL_S if within_s is None else within_s, op, self._stuck)
        except StoreSilent:  # on every node: the store is given up on (self._stuck)
            raise NodeLost(str(self._unanswered)) from None
        except Exception as exc:  # noqa: BLE001 - c10d raises DistError and RuntimeError
            if self.place.coordinator:  # its own store: a fault of this launcher
                raise
            raise NodeLost(f"node 0 ({self.place.master_addr}) stopped answering: "
                           f"{_first_line(exc)}") from None

    def _stuck(self, why: str) -> None:
        """A call timed out: no other is tried (NodeLost at once)."""
        where = f"{self.place.master_addr}:{self.place.master_port}"
        self._unanswered = (f"the launch's store ({where}) stopped answering: {why}"
                            if self.place.coordinator else
                            f"node 0 ({self.place.master_addr}) stopped answering: {why}")

    # -- lockstep ---------------------------------------------------------------------------

    def publish(self, key: str, value: dict[str, Any]) -> None:
        self._call(lambda: self.store.set(key, json.dumps(value).encode()))

    def read(self, key: str) -> dict[str, Any] | None:
        """`key`'s value, or None while it is not there (no wait)."""
        if not self._call(lambda: self.store.check([key])):
            return None
        return dict(json.loads(self._call(lambda: self.store.get(key))))

    def await_key(self, key: str, deadline: float | None = None) -> dict[str, Any]:
        """Wait for node 0 to publish `key`, as long as node 0 answers and, if given,
        until `deadline` (monotonic; then NodeLost)."""
        while (value := self.read(key)) is None:
            self.silent()
            if deadline is not None and time.monotonic() > deadline:
                raise NodeLost(f"node 0 ({self.place.master_addr}) did not say {key} in "
                               "time: this host's part is closed without it")
            if deadline is None and (why := self.stop_requested()) is not None:
                raise StoppedElsewhere(f"stopped on {why}")
            time.sleep(POLL_S)
        return value

    def abort(self, run: int, reason: str) -> str:
        """Fail run `run` on every node, unless another node already did: the first
        reason given is the one kept (and returned)."""
        key = f"run/{run}/abort"
        kept = self._call(lambda: self.store.compare_set(
            key, b"", f"node {self.place.node_rank}: {reason}".encode()))
        return bytes(kept).decode()

    def aborted(self, run: int) -> str | None:
        key = f"run/{run}/abort"
        if not self._call(lambda: self.store.check([key])):
            return None
        return bytes(self._call(lambda: self.store.get(key))).decode()

    def trouble(self, run: int) -> str | None:
        """Why this node's workers must stop now though none of them failed: the run
        failed on another node, or a node stopped answering (raises NodeLost for node 0)."""
        if (reason := self.aborted(run)) is not None:
            return reason
        silent = self.silent()
        if silent:
            return self.abort(run, f"node {silent[0]} stopped answering (no heartbeat for "
                                   f"{STALE_S:g} s)")
        return None

    def request_stop(self, reason: str) -> None:
        """This node was stopped: every node stops the suite after its current run."""
        try:
            self._call(lambda: self.store.compare_set(
                "stop", b"", f"node {self.place.node_rank}: {reason}".encode()))
        except Exception:  # noqa: BLE001 - node 0 gone: nobody is left to tell
            pass

    def stop_requested(self) -> str | None:
        """Why another node stopped the suite, or None."""
        if not self._call(lambda: self.store.check(["stop"])):
            return None
        return bytes(self._call(lambda: self.store.get("stop"))).decode()

    def require_all(self, left: int) -> None:
        """Before a run: every node is still there (a lost node does not come back), and
        no node stopped the suite."""
        if self.lost:
            raise NodeLost(f"node {min(self.lost)} stopped answering: the suite stops, "
                           f"{left} run(s) not started")
        if (why := self.stop_requested()) is not None:
            raise StoppedElsewhere(f"stopped on {why}")

    def launch_numbers(self, launch: str, first: dict[str, int]) -> tuple[str, dict[str, int]]:
        """The launch id and each run's first repeat number node 0 chose (every node's run
        directories are named from them)."""
        if self.place.coordinator:
            self.publish("launch", {"launch": launch, "first": first})
            return launch, first
        chosen = self.await_key("launch")
        return str(chosen["launch"]), {str(k): int(v) for k, v in chosen["first"].items()}

    def finish(self, within_s: float | None = None) -> None:
        """The suite is over here: node 0 waits (as long as they answer; at most
        `within_s`, if given) for every other node to say so too before its store, which
        they read, goes away."""
        self.publish(f"end/{self.place.node_rank}", {})
        if not self.place.coordinator:
            return
        deadline = None if within_s is None else time.monotonic() + within_s
        pending = set(range(1, self.place.nnodes))
        while pending and (deadline is None or time.monotonic() < deadline):
            pending = {k for k in pending if self.read(f"end/{k}") is None} \
                - set(self.silent())
            if pending:
                time.sleep(POLL_S)

    def leave(self, reason: str) -> None:
        """This node ends the suite early (an interrupt, an error, a lost node): the
        others stop too rather than wait for a run that will not start, and node 0 gives
        them time to hear it."""
        self.request_stop(reason)
        try:
            self.finish(within_s=2 * STALE_S)
        except Exception:  # noqa: BLE001 - node 0 gone: nobody is left to tell
            pass

    # -- a run's end ------------------------------------------------------------------------

    def report(self, run: int, status: str, reason: str, share: Path,
               deadline: float | None = None) -> None:
        """This node's end of run `run` (node k > 0): its logs, and after a failure its
        flushed parts (rank 0 gathered the records of a run that completed), then how its
        workers ended. A file is sent within the closing's `deadline` (monotonic): a
        slow link may take long, a store that answers nothing not forever."""
        names = []
        parts = sorted(share.glob("parts/*")) if status != "completed" else []
        for path in parts + sorted(share.glob("logs/*")):
            name = path.relative_to(share).as_posix()
            if path.is_file() and SENT_FILE.fullmatch(name):
                data = path.read_bytes()
                self._call(lambda n=name, d=data: self.store.set(
                    f"run/{run}/file/{self.place.node_rank}/{n}", d),
                    within_s=max(STORE_CALL_S, (deadline or 0) - time.monotonic()))
                names.append(name)
        self.publish(f"run/{run}/done/{self.place.node_rank}",
                     {"status": status, "reason": reason, "files": names})

    def collect(self, run: int, run_dir: Path, deadline: float | None = None
                ) -> dict[int, dict[str, Any]]:
        """On node 0: every other node's end of run `run`, its files written into
        `run_dir` beside node 0's (ranks differ: no file is overwritten), as long as it
        answers and, if given, until `deadline` (monotonic). Returns node -> its report; a
        node that stopped answering, or did not report in time, reports {"status":
        "lost"}."""
        pending = set(range(1, self.place.nnodes))
        reports: dict[int, dict[str, Any]] = {}
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                for k in sorted(pending):  # (it may still answer: not `lost`)
                    reports[k] = {"status": "lost", "reason": f"node {k} did not hand its "
                                  "records over in time"}
                break
            for k in sorted(pending):
                if (done := self.read(f"run/{run}/done/{k}")) is not None:
                    self._receive(run, k, done.get("files", []), run_dir)
                    reports[k] = done
                    pending.discard(k)
            for k in self.silent():
                if k in pending:
                    reports[k] = {"status": "lost", "reason": f"node {k} stopped answering"}
                    pending.discard(k)
                    self.lost.add(k)
            if pending:
                time.sleep(POLL_S)
        return reports

    def _receive(self, run: int, node: int, names: list[str], run_dir: Path) -> None:
        for name in names:
            target = run_dir / name
            if not SENT_FILE.fullmatch(name) or target.exists():
                continue
            target.parent.mkdir(exist_ok=True)
            target.write_bytes(bytes(self._call(
                lambda n=name: self.store.get(f"run/{run}/file/{node}/{n}"))))

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2 * BEAT_S)


SHARE_FILE = "node.json"  # in another node's share of a run: which node, how it ended


@dataclass
class Seat:
    """This host's part of one run across hosts."""

    nodes: Nodes
    index: int  # the run's number in the launch: its keys in the store
    port: int  # the workers' rendezvous, on the master's address (rank 0 serves it)
    # the services' rendezvous (the parameter servers' RPC group), on the master's address
    services_port: int
    interface: str  # what the workers' libraries bind
    ranks: list[int]  # the run's workers on this host

    @property
    def node(self) -> int:
        return self.nodes.place.node_rank

    def trouble(self) -> str | None:
        return self.nodes.trouble(self.index)

    def service_port(self) -> int:
        """The port node 0 picked for the run's services' rendezvous: every host's services
        and workers meet there (one port: what hetbench's servers need)."""
        return self.services_port

    def close(self, run_dir: Path, run: RunSpec, repeat: int, status: str, reason: str,
              raised: BaseException | None, dropped: list[dict[str, Any]]) -> RunResult:
        """After this host's workers stopped: the run fails everywhere if it failed here;
        node 0 closes the run directory with every node's flushed records that reach it;
        another node hands them over and keeps its share (`run_dir`) closed as its part
        ended, then learns how the run ended."""
        nodes, index = self.nodes, self.index
        deadline = time.monotonic() + close_deadline_s(run)
        lost = isinstance(raised, NodeLost)
        if not nodes.place.coordinator:  # first: node 0 may be gone (NodeLost from here on)
            _write_share(run_dir, nodes.place.node_rank, status, reason)
        if isinstance(raised, KeyboardInterrupt) and not isinstance(raised, StoppedElsewhere):
            nodes.request_stop(reason)
        if status != "completed" and not lost:
            nodes.abort(index, reason)
        if not nodes.place.coordinator:
            if lost:
                return RunResult(run, repeat, run_dir, status, reason)
            nodes.report(index, status, reason, run_dir, deadline)
            closed = nodes.await_key(f"run/{index}/closed", deadline)
            _write_share(run_dir, nodes.place.node_rank, closed["status"], closed["reason"])
            return RunResult(run, repeat, run_dir, closed["status"], closed["reason"])
        reports = nodes.collect(index, run_dir, deadline)
        status, reason = outcome(status, reason, nodes.aborted(index), reports,
                                 nodes.stop_requested())
        result = close_run(run_dir, run, status, reason, repeat, dropped)
        nodes.publish(f"run/{index}/closed", {"status": result.status, "reason": result.reason})
        return result


def close_deadline_s(run: RunSpec) -> float:
    """How long a run's closing may wait for the other hosts: their workers stop within
    timeout_s (a peer's collective times out by then), and their records cross after."""
    return run.timeout_s + CLOSE_MARGIN_S


def _within(seconds: float, op: Callable[[], Any], stuck: Callable[[str], None]) -> Any:
    """op() in a thread of its own, waited for at most `seconds`: then `stuck(why)` and
    StoreSilent (the thread is left in its socket; the process exits without joining it:
    exits.py). c10d's TCPStore client is not bounded by its own timeout against a peer
    that answers nothing without closing its socket: measured here, a get from a
    SIGSTOPped server's store with a 3 s timeout still waited after 40 s. A signal during
    the wait is raised once the call has ended (or the time is up): the client is not
    thread-safe, so no other call may start while this one is in its socket."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = op()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=call, name="hetbench-store-call", daemon=True)
    deadline = time.monotonic() + seconds
    interrupt: KeyboardInterrupt | None = None
    while True:
        try:  # a signal anywhere here is held until the call is out of the socket
            if thread.ident is None:
                thread.start()
            while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
                thread.join(left)
            break
        except KeyboardInterrupt as exc:
            interrupt = interrupt or exc
    if thread.is_alive():
        stuck(f"no answer within {seconds:g} s")
    if interrupt is not None:
        raise interrupt
    if thread.is_alive():
        raise StoreSilent(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def outcome(status: str, reason: str, aborted: str | None, reports: dict[int, dict[str, Any]],
            stop: str | None) -> tuple[str, str]:
    """How a run across hosts ended, from node 0's end of it (`status`, `reason`), the
    first node's reason to fail it (`aborted`), every other node's report and a node's
    stop: the cause named first is a node that stopped answering, else a worker killed
    by a signal (its peers' errors followed from it), else the first failure reported."""
    if stop is not None:
        return "interrupted", f"stopped on {stop}"
    ends = {0: {"status": status, "reason": reason}, **reports}
    if all(e["status"] == "completed" for e in ends.values()):
        return "completed", reason
    lost = [f"node {k} stopped answering (no heartbeat for {STALE_S:g} s)"
            for k, e in sorted(ends.items()) if e["status"] == "lost"]
    signalled = [f"node {k}: {e['reason']}" for k, e in sorted(ends.items())
                 if "killed by SIG" in e.get("reason", "") and not
                 e["reason"].startswith("node ")]
    first = aborted or next((f"node {k}: {e['reason']}" for k, e in sorted(ends.items())
                             if e["status"] != "completed"), "")
    causes = lost + signalled or [first]
    if first not in causes and not any(c in first for c in causes):
        causes.append(f"then {first}")
    return "failed", "; ".join(causes)


def prepare_share(share: Path, suite_name: str, run: RunSpec, node: int) -> Path:
    """Another node's share of a run: run.json for its workers, their parts and logs, and
    SHARE_FILE saying it runs and which launcher holds it (until that launcher says how it
    ended; `recover_share` closes it where the launcher could not)."""
    (share / collector.PARTS_DIR).mkdir(parents=True, exist_ok=True)
    (share / RUN_FILE).write_text(json.dumps({"suite": suite_name, "run": run.to_dict()}))
    _write_share(share, node, "running", "")
    return share


def record_share_tmp(share: Path, tmp: Path) -> None:
    """This node's private TMPDIR for the run (harness/system/services.py), in its share:
    `recover_share` removes it where the launcher was killed before it could."""
    state = _kept_state(share)
    _write_share(share, int(state.get("node", -1)), str(state.get("status", "running")),
                 str(state.get("reason", "")), tmp=str(tmp))


def _write_share(share: Path, node: int, status: str, reason: str,
                 launcher: dict[str, Any] | None = None, tmp: str | None = None) -> None:
    if launcher is None:  # this process holds the share
        launcher = {"host": socket.gethostname(), "pid": os.getpid(),
                    "started": procfs.start_ticks(os.getpid())}
    tmp = tmp if tmp is not None else _kept_state(share).get("tmp")
    try:
        (share / SHARE_FILE).write_text(json.dumps(
            {"node": node, "status": status, "reason": reason, "launcher": launcher}
            | ({} if tmp is None else {"tmp": tmp})))
    except OSError:  # the records matter more; node 0 holds how the run ended
        pass


def _kept_state(share: Path) -> dict[str, Any]:
    """What the share says so far ({} where it says nothing readable)."""
    try:
        state = json.loads((share / SHARE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def find_shares(path: Path) -> list[Path]:
    """The shares at `path` or below it (a results folder, a suite's, a run's), in order."""
    patterns = (SHARE_FILE, f"nodes/*/{SHARE_FILE}", f"*/nodes/*/{SHARE_FILE}",
                f"*/*/nodes/*/{SHARE_FILE}")
    return [p.parent for pattern in patterns for p in sorted(path.glob(pattern))]


def share_state(share: Path) -> dict[str, Any]:
    """What a share says: its node, how its part ended ("running" while its launcher holds
    it), why, and its launcher."""
    state = jsonfile.read(share / SHARE_FILE, "node's share")
    if not isinstance(state, dict):
        raise UsageError(str(share / SHARE_FILE), "unreadable node's share: not a JSON object")
    return state


def recover_share(share: Path) -> int:
    """Close a share whose launcher died before it could (a SIGKILL): `failed`. Node 0 closed
    the run itself, with the records of this node that reached it; the rest stay here, in
    their flushed parts, as they are. Refused while the launcher lives or where this host
    cannot tell (UsageError). Returns the step records the share holds."""
    from hetbench.harness.records.results import require_launcher_gone  # pandas: here only

    state = share_state(share)
    launcher = state.get("launcher") or {}
    if state.get("status") != "running":
        raise UsageError(str(share), f"not running: it is already closed "
                         f"({state.get('status')})")
    require_launcher_gone(state, str(share))
    _write_share(share, int(state.get("node", -1)), "failed",
                 f"its launcher (pid {launcher.get('pid')}) ended without closing this "
                 "node's share; closed by hetbench recover (its flushed records stay in "
                 f"{collector.PARTS_DIR}/)", launcher)
    tmp = state.get("tmp")
    services.remove_private_tmp(tmp if isinstance(tmp, str) else None)  # the dead launcher's
    return sum(len(part) for part in collector.read_parts(share))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
