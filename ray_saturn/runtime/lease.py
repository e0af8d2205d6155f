"""One run per run folder: a lease object with its owner's id and a heartbeat.

``run``, ``resume`` and ``emulate`` hold the lease of their run folder
(``RUN_DIR/lease.json``) from before anything starts until they return.
The lease names its owner (a random id, the host, the process id and its
start time, the command and the run) and carries a heartbeat that a thread
renews every :data:`~ray_saturn.defaults.LEASE_HEARTBEAT_S` seconds.

- A second ``run``/``resume``/``emulate`` on a folder whose lease is live
  refuses with one line naming the owner (:class:`RunLocked`).
- A lease whose owner is dead is *stale*: its process is gone (same machine:
  the process id no longer runs, or runs another program) or its heartbeat
  is older than :data:`~ray_saturn.defaults.LEASE_STALE_S`. It is taken over,
  with a warning that says whose it was.
- ``ray-saturn status`` reads the same lease: "driver not seen for N s".

The lease is created with :meth:`RunStorage.create_exclusive
<ray_saturn.runtime.storage.RunStorage.create_exclusive>` (atomic on a local
disk and on S3: of two starts, one creates it and the other finds it and
refuses). A stale lease is deleted (if it is still the same stale lease) and
created anew. Where the create is not atomic, and after a take-over (two
resumes may race), the new owner waits :data:`SETTLE_S` and reads its lease
back: of two racing writers, both read the one that landed last. Every
heartbeat reads the lease first, so an owner whose lease was taken over (it
had been paused for longer than the stale limit) learns it and stops
(:attr:`RunLease.lost`).

Example:
    >>> import tempfile
    >>> from ray_saturn.runtime.storage import RunStorage
    >>> store = RunStorage(tempfile.mkdtemp())
    >>> with RunLease(store, command="run", run_name="sweep").held() as lease:
    ...     RunLease(store, command="run").acquire()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ray_saturn.runtime.lease.RunLocked: ... is in use by `ray-saturn run` (run sweep, pid ...
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from ray_saturn import defaults
from ray_saturn.runtime.storage import RunStorage, StorageError

__all__ = ["LEASE_FILE", "LeaseInfo", "RunLease", "RunLocked", "live_owner", "locked_error", "read_lease"]

logger = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
#: Seconds between writing our lease and reading it back (two starts racing: both read the winner).
SETTLE_S = 0.5


class RunLocked(StorageError):
    """The run folder is in use by a live run (the message names it)."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _proc_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of proc(5): starttime
    except (IndexError, ValueError):
        return None


def _machine() -> str:
    """Identifies this host *and* process-id namespace: where a pid check means something."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id",):
        try:
            with open(path) as f:
                parts.append(f.read().strip())
        except OSError:
            parts.append("?")
    try:
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        parts.append("?")
    return "|".join(parts)


@dataclass(frozen=True)
class LeaseInfo:
    """What ``lease.json`` holds: who owns the run folder, and when it was last seen."""

    owner: str
    host: str
    machine: str
    pid: int
    pid_start: int | None
    command: str
    run_name: str | None
    started_wall: float
    heartbeat_wall: float

    @classmethod
    def from_dict(cls, d: Any) -> LeaseInfo:
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        return cls(
            owner=str(d["owner"]),
            host=str(d.get("host", "?")),
            machine=str(d.get("machine", "")),
            pid=int(d.get("pid", -1)),
            pid_start=None if d.get("pid_start") is None else int(d["pid_start"]),
            command=str(d.get("command", "?")),
            run_name=None if d.get("run_name") is None else str(d["run_name"]),
            started_wall=float(d.get("started_wall", 0.0)),
            heartbeat_wall=float(d["heartbeat_wall"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def seen_s_ago(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat (infinite for one that is not a time: NaN, infinite)."""
        if not math.isfinite(self.heartbeat_wall):
            return math.inf
        return max(0.0, (time.time() if now is None else now) - self.heartbeat_wall)

    def bad_heartbeat(self, now: float | None = None, stale_after_s: float = defaults.LEASE_STALE_S) -> str | None:
        """Why the heartbeat cannot be a live owner's (not a finite time, or further ahead than any clock
        skew), else ``None``."""
        if not math.isfinite(self.heartbeat_wall):
            return f"its heartbeat {self.heartbeat_wall} is not a time"
        ahead = self.heartbeat_wall - (time.time() if now is None else now)
        if ahead > stale_after_s:
            return f"its heartbeat is {ahead:.0f} s in the future"
        return None

    def process_gone(self) -> bool:
        """True when the owner ran on this machine and its process no longer runs."""
        if self.machine != _machine() or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # another user's process: it runs
        if self.pid_start is not None:
            start = _proc_start(self.pid)
            return start is not None and start != self.pid_start  # the pid was reused
        return False

    def alive(self, now: float | None = None, stale_after_s: float = defaults.LEASE_STALE_S) -> bool:
        """Whether the owner still runs (judged by its process, else by its heartbeat)."""
        if self.process_gone() or self.bad_heartbeat(now, stale_after_s) is not None:
            return False
        return self.seen_s_ago(now) <= stale_after_s

    def describe(self) -> str:
        run = f"run {self.run_name}, " if self.run_name else ""
        return f"`ray-saturn {self.command}` ({run}pid {self.pid} on {self.host})"


def locked_error(storage: RunStorage, owner: LeaseInfo) -> RunLocked:
    """The one-line refusal for a folder that ``owner`` holds."""
    return RunLocked(
        f"{storage.display} is in use by {owner.describe()}, last seen {owner.seen_s_ago():.0f} s ago; "
        f"wait for it to end (or stop it), or use another run folder (if it no longer runs, delete "
        f"{storage.display}/{LEASE_FILE} to take the folder over)"
    )


def live_owner(storage: RunStorage) -> LeaseInfo | None:
    """The live owner of the folder's lease (``None``: free, or its owner is dead)."""
    info = read_lease(storage)
    return info if info is not None and info.alive() else None


def read_lease(storage: RunStorage) -> LeaseInfo | None:
    """The run folder's lease (``None`` when there is none, or it is unreadable)."""
    try:
        if not storage.exists(LEASE_FILE):
            return None
        return LeaseInfo.from_dict(json.loads(storage.read_bytes(LEASE_FILE)))
    except (StorageError, OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("%s: ignoring an unreadable %s (%s)", storage.display, LEASE_FILE, exc)
        return None


class RunLease:
    """The lease of one run folder, held by this process (see the module docstring).

    Args:
        storage: the run folder.
        command: what holds it (``run``, ``resume``, ``emulate``), for the refusal message.
        run_name: the run's name, for the refusal message.
        heartbeat_s: seconds between heartbeats.
        stale_after_s: a lease whose heartbeat is older is stale (taken over).
        settle_s: seconds between writing the lease and reading it back.
    """

    def __init__(
        self,
        storage: RunStorage,
        *,
        command: str,
        run_name: str | None = None,
        heartbeat_s: float = defaults.LEASE_HEARTBEAT_S,
        stale_after_s: float = defaults.LEASE_STALE_S,
        settle_s: float = SETTLE_S,
    ) -> None:
        if not 0 < heartbeat_s < stale_after_s:
            raise ValueError(f"heartbeat every {heartbeat_s} s must be > 0 and < the stale limit {stale_after_s} s")
        self.storage = storage
        self.heartbeat_s = float(heartbeat_s)
        self.stale_after_s = float(stale_after_s)
        self.settle_s = float(settle_s)
        now = time.time()
        self.info = LeaseInfo(
            owner=uuid.uuid4().hex,
            host=socket.gethostname(),
            machine=_machine(),
            pid=os.getpid(),
            pid_start=_proc_start(os.getpid()),
            command=command,
            run_name=run_name,
            started_wall=now,
            heartbeat_wall=now,
        )
        #: The lease this one took over from a dead owner (``None``: the folder was free).
        self.taken_over: LeaseInfo | None = None
        #: Set when another owner took the lease while this one held it.
        self.lost: LeaseInfo | None = None
        self._held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_failures = 0

    # ------------------------------------------------------------ acquire
    def acquire(self) -> LeaseInfo | None:
        """Take the lease; returns the stale lease taken over (``None``: the folder was free).

        Raises:
            RunLocked: the folder's lease is held by a live owner (named in the message).
        """
        for _ in range(5):
            if self._create():
                break
            current = read_lease(self.storage)
            if current is None:
                continue  # released (or unreadable) meanwhile: try again
            if current.owner == self.info.owner:
                break
            if current.alive(stale_after_s=self.stale_after_s):
                raise self._locked(current)
            # Stale: remove it, unless it changed meanwhile (another run took it over first).
            again = read_lease(self.storage)
            if again is None or again.owner != current.owner:
                continue
            self.taken_over = current
            self.storage.delete(LEASE_FILE, missing_ok=True)
        else:
            raise RunLocked(f"{self.storage.display}: could not take {LEASE_FILE} after 5 tries; is another run "
                            f"starting on this folder? try again (if no run uses it and {LEASE_FILE} is damaged, "
                            f"delete {self.storage.display}/{LEASE_FILE})")
        if self.taken_over is not None or not self.storage.exclusive_create_is_atomic:
            # Not atomic here (or a take-over, where two resumes may race): read our lease back after a
            # pause; of two racing writers both read the one that landed last.
            if self.settle_s > 0:
                time.sleep(self.settle_s)
            back = read_lease(self.storage)
            if back is None or back.owner != self.info.owner:
                if back is not None:
                    raise self._locked(back)
                raise RunLocked(f"{self.storage.display}: the lease written to {LEASE_FILE} did not read back; is "
                                "the folder shared with another run? try again")
        self._held = True
        if self.taken_over is not None:
            why = ("its process is gone" if self.taken_over.process_gone()
                   else self.taken_over.bad_heartbeat(stale_after_s=self.stale_after_s)
                   or f"not seen for {self.taken_over.seen_s_ago():.0f} s")
            logger.warning(
                "%s: taking over the lock of %s: %s",
                self.storage.display, self.taken_over.describe(), why,
            )
        return self.taken_over

    def _data(self) -> bytes:
        return (json.dumps(self.info.to_dict(), sort_keys=True) + "\n").encode()

    def _create(self) -> bool:
        """Write our lease if there is none (atomically where the storage can)."""
        self.info = replace(self.info, heartbeat_wall=time.time())
        try:
            return self.storage.create_exclusive(LEASE_FILE, self._data())
        except (StorageError, OSError) as exc:
            raise StorageError(
                f"{self.storage.display}: cannot write {LEASE_FILE} ({_one_line(exc)}); make the run folder "
                "writable"
            ) from None

    def _locked(self, other: LeaseInfo) -> RunLocked:
        return locked_error(self.storage, other)

    def _write(self) -> None:
        self.info = replace(self.info, heartbeat_wall=time.time())
        self.storage.write_bytes(LEASE_FILE, self._data())

    # ---------------------------------------------------------- heartbeat
    def start_heartbeat(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._beat, name="ray-saturn-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.renew()
            if self.lost is not None:
                return

    def renew(self) -> None:
        """One heartbeat: check the lease is still ours, then write it with the time now."""
        try:
            current = read_lease(self.storage)
            if current is not None and current.owner != self.info.owner:
                self.lost = current
                logger.error(
                    "%s: the run folder's lock was taken over by %s while this run held it",
                    self.storage.display, current.describe(),
                )
                return
            self._write()
            self._write_failures = 0
        except (StorageError, OSError) as exc:
            self._write_failures += 1
            if self._write_failures == 1:
                logger.warning("%s: cannot renew the run folder's lock (%s)", self.storage.display, _one_line(exc))

    def check(self) -> None:
        """Raise :class:`RunLocked` if another owner took the lease while this one held it."""
        if self.lost is not None:
            raise RunLocked(
                f"{self.storage.display}: {self.lost.describe()} took over this run folder while this run held it "
                "(was this process paused?); stopping"
            )

    # ------------------------------------------------------------ release
    def release(self) -> None:
        """Stop the heartbeat and remove the lease (if it is still ours); never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
            self._thread = None
        if not self._held:
            return
        self._held = False
        try:
            current = read_lease(self.storage)
            if current is not None and current.owner == self.info.owner:
                self.storage.delete(LEASE_FILE, missing_ok=True)
        except (StorageError, OSError) as exc:
            logger.warning("%s: could not remove the run folder's lock (%s); the next run will take it over",
                           self.storage.display, _one_line(exc))

    @contextlib.contextmanager
    def held(self) -> Iterator[RunLease]:
        """Acquire, heartbeat while the block runs, release on every way out."""
        self.acquire()
        try:
            self.start_heartbeat()
            yield self
        finally:
            self.release()

    def __repr__(self) -> str:
        return f"RunLease({self.storage.display!r}, owner={self.info.owner[:8]})"
