"""Which guard runs, `guard.py` or the C `guard.c`, and how the C guard's binary comes to exist.

The C guard is 1 MB of RSS where the Python one is a second interpreter (10 MB), with the same
containment and wire format (docs/guard.md). No user has to install a compiler and no start waits
for one: the binary is built from the packaged source into the user's cache (a 0700 directory; the
name keyed by a hash of the source and the machine, so a binary of another source is never used),
with `cc`, `gcc` or `clang` if one is on PATH, atomically (temp file, a ``--version`` check that it
runs and is this source, rename), either in the background after the first guard starts (that
session still runs the Python guard; the next one has the C guard) or at once by
`aggregator install`. ``AGGREGATOR_GUARD``: ``auto`` (default: C when built, else Python),
``c`` (build it now if needed; Python only if that fails), ``python``. A failed build is one log
line and a marker file, so later starts do not try again with the same compiler; it is never an
error for the user.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO

from aggregator.log import get_logger

log = get_logger(__name__)

SOURCE = Path(__file__).with_name("guard.c")
PYTHON_GUARD = Path(__file__).with_name("guard.py")
MODES = ("auto", "c", "python")
COMPILERS = ("cc", "gcc", "clang")
# static first (0.8 MB RSS against 1.6 dynamically linked: no shared libc pages counted in RSS), and
# dynamically linked where the static C library is not installed
CFLAGS = (("-O2", "-s", "-static"), ("-O2", "-s"))
BUILD_DELAY_SECONDS = 2.0  # the background build waits until the start-up is done
BUILD_TIMEOUT_SECONDS = 120.0
CHECK_TIMEOUT_SECONDS = 10.0
TIMED_OUT = "timed out after"
STALE_TEMP_SECONDS = 600.0  # a temp file this old is a build that was killed: removed by the next build


@dataclass(frozen=True)
class Choice:
    """The guard to start: `command` is followed by PARENT_PID SOCKET_FD."""

    kind: str  # "c" or "python"
    command: tuple[str, ...]
    reason: str
    fix: str = ""  # what would make the C guard run (doctor shows it)


def mode() -> str:
    """``AGGREGATOR_GUARD``, lower-cased; anything else than auto, c or python is auto."""
    value = os.environ.get("AGGREGATOR_GUARD", "").strip().lower()
    return value if value in MODES else "auto"


@cache
def libc() -> str:
    """The C library this process runs on ("glibc 2.36"); "" where it does not say (musl)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return ""


@cache
def source_key() -> str:
    """What the binary's name is keyed by: the source, the machine and the C library it is built for (a
    dynamically linked guard built on a newer glibc does not start on an older one: a home shared by
    two hosts gets one binary per libc)."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"\0{os.uname().machine}\0{libc()}".encode())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("aggregator")) / "guard"


def binary() -> Path:
    """Where the C guard of this source is, once built."""
    return cache_dir() / f"guard-{source_key()}"


def _failed_marker() -> Path:
    return cache_dir() / f"guard-{source_key()}.failed"


def compiler() -> str | None:
    """The C compiler to build with: ``CC`` when it names one program, else the first of cc, gcc, clang."""
    for name in (os.environ.get("CC", "").strip(), *COMPILERS):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _compiler_identity(path: str) -> str:
    """A failure marker holds this: a new or updated compiler is tried again."""
    try:
        info = os.stat(path)
    except OSError:
        return path
    return f"{path} {info.st_size} {info.st_mtime_ns}"


_distrusted: set[tuple[str, str]] = set()  # (path, why) already logged by this process


def _untrusted(path: Path, *, directory: bool) -> str | None:
    """Why `path` may not be trusted to run a program from (planted by someone else), or None: it must
    be ours, not a symlink, not writable by group or others (lstat: a symlink is never followed)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "it is a symlink"
    if info.st_uid != os.getuid():
        return f"it belongs to uid {info.st_uid}, not to this user"
    if info.st_mode & 0o022:
        return f"group or others may write it (mode {stat.S_IMODE(info.st_mode):o})"
    if not (stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)):
        return "it is not a directory" if directory else "it is not a regular file"
    return None


def _distrust(path: Path, why: str) -> None:
    if (str(path), why) not in _distrusted:
        _distrusted.add((str(path), why))
        log.warning("C guard not used: the Python guard runs", path=str(path), reason=why)


def trusted_folder(folder: Path) -> bool:
    """The cache directory may hold a guard we run (one log line, once, when not)."""
    try:
        why = _untrusted(folder, directory=True)
    except OSError:
        return False
    if why is not None:
        _distrust(folder, why)
    return why is None


def built() -> Path | None:
    """The C guard of this source, when it is built and can be trusted (see `_untrusted`), else None."""
    path = binary()
    try:
        why = _untrusted(path, directory=False)
    except OSError:
        return None
    if why is None and not os.access(path, os.X_OK):
        why = "it is not executable"
    if why is not None or not trusted_folder(path.parent):
        if why is not None:
            _distrust(path, why)
        return None
    return path


_unusable: dict[str, str] = {}  # binary -> why it did not start in this process


def did_not_start(path: str, reason: str, *, ran: bool) -> Choice:
    """The C guard at `path` did not start: the Python guard runs for the rest of this process. The binary
    is removed, so a broken one (a crash left it empty) is built again; one that ran but exited before
    its first answer (a libc it cannot load) also leaves the failure marker, so later starts do not
    build it again with the same compiler. The caller logs the returned choice (one line)."""
    _unusable[path] = reason
    with contextlib.suppress(OSError):
        os.unlink(path)
    cc = compiler()
    if ran and cc is not None:
        with contextlib.suppress(OSError):
            _failed_marker().write_text(f"{_compiler_identity(cc)}\n{reason}\n")
    return python_choice(reason)


def kind_of(pid: int) -> str | None:
    """ "c" or "python" when process `pid` runs a guard (any build of it), else None (Linux, /proc)."""
    try:
        if Path(os.readlink(f"/proc/{pid}/exe")).name.startswith("guard-"):
            return "c"
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return "python" if any(word.endswith(b"/guard.py") for word in argv) else None


def python_choice(reason: str, fix: str = "") -> Choice:
    return Choice("python", (sys.executable, "-I", "-S", str(PYTHON_GUARD)), reason, fix)


def choose(*, start_build: bool) -> Choice:
    """The guard to run now, and why. `start_build`: in auto mode, start the background build when the
    C guard is not built yet (`doctor` only asks)."""
    wanted = mode()
    if wanted == "python":
        return python_choice("AGGREGATOR_GUARD=python")
    if sys.platform != "linux":
        return python_choice("the C guard is Linux-only")
    if str(binary()) in _unusable:
        return python_choice(_unusable[str(binary())], "see the log line above it")
    path = built()
    if path is not None:
        return Choice("c", (str(path),), f"built at {path}")
    cc = compiler()
    again = "`aggregator install CLIENT` builds it at once"
    if cc is None:
        reason = f"no C compiler on PATH ({', '.join(COMPILERS)}) to build the C guard"
        return python_choice(reason, f"install one (cc or gcc); the next start builds the C guard, or {again}")
    failed = _read_failure(cc)
    if failed is not None:
        return python_choice(f"the C guard failed to build with {cc}: {failed}", f"once that is fixed, {again}")
    unwritable = _unwritable(cache_dir())
    if unwritable is not None:  # no build, so no warning at every start: the choice's one line says it
        reason = f"the C guard cannot be built: the cache {unwritable}"
        return python_choice(reason, "make it writable (or point XDG_CACHE_HOME elsewhere)")
    if wanted == "c":
        if start_build and _build_now_once():
            return choose(start_build=False)
        reason = "AGGREGATOR_GUARD=c, but the C guard is not built yet"
        return python_choice(reason, f"the next start builds it, or {again}")
    if start_build:
        _builder.start()
    reason = f"the C guard is not built yet: the next start builds it in the background with {cc}"
    return python_choice(reason, f"none needed, or {again}")


def _unwritable(folder: Path) -> str | None:
    """Why no guard can be built into `folder` (a read-only cache), or None: its nearest existing
    ancestor must be a directory this process may write."""
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


_built_now: set[str] = set()  # binaries this process built at a guard's start (AGGREGATOR_GUARD=c)
_built_now_lock = threading.Lock()


def _build_now_once() -> bool:
    """Build at a guard's start, once per process and binary: a failure is not tried again at every
    start, which waits for it (it left its marker, or it was a lock or cache problem)."""
    with _built_now_lock:
        if str(binary()) in _built_now:
            return False
        _built_now.add(str(binary()))
    build()
    return True


def _read_failure(cc: str) -> str | None:
    """The reason of an earlier failed build with this very compiler, if any."""
    try:
        identity, _, reason = _failed_marker().read_text().partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    if identity != _compiler_identity(cc):
        return None
    return reason.strip() or "unknown"


def build(owner: _Builder | None = None) -> Path | None:
    """Build the C guard now unless it is built; its path, or None (one log line says why).

    Concurrent builds, in this process or others, are safe: one takes the lock, another waits for it
    and then finds the binary (a background one does not wait: the next start finds it). `owner`, the
    background build's, can end it early: it holds the compiler's process while it runs and kills it.
    """
    cc = compiler()
    if cc is None:
        log.info("C guard not built: no C compiler on PATH", compilers=", ".join(COMPILERS))
        return None
    folder = cache_dir()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        if not trusted_folder(folder):  # a guard built there would not be run
            return None
        with open(folder / ".build.lock", "a") as lock:
            if not _locked(lock, owner):  # another builder: a background build leaves it to that one
                return built()
            return built() or _compile(cc, folder, owner)
    except OSError as exc:
        log.warning("C guard not built", reason=f"{folder}: {exc.strerror or exc}")
        return None


def _locked(lock: IO[str], owner: _Builder | None) -> bool:
    """Take the build lock (released with the file, or when a killed builder's process ends). A background
    build (`owner` given) does not wait for another builder; a build asked for now waits for it, up to
    BUILD_TIMEOUT_SECONDS."""
    deadline = time.monotonic() + BUILD_TIMEOUT_SECONDS
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if owner is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _compile(cc: str, folder: Path, owner: _Builder | None) -> Path | None:
    _remove_stale_temps(folder)
    key = source_key()
    temp = folder / f".guard-{key}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        for flags in CFLAGS:
            command = [cc, *flags, f'-DGUARD_SOURCE_HASH="{key}"', "-o", str(temp), str(SOURCE)]
            reason = _run(command, BUILD_TIMEOUT_SECONDS, owner) or _check(temp, key)
            stopped = owner is not None and owner.stop.is_set()
            if reason is None or stopped or reason.startswith(TIMED_OUT):
                break  # a compiler that hangs is not waited for twice
        if reason is not None:
            if not stopped:
                log.warning("C guard not built; the Python guard runs", compiler=cc, reason=reason)
                _failed_marker().write_text(f"{_compiler_identity(cc)}\n{reason}\n")
            return None
        os.chmod(temp, 0o700)
        _fsync(temp)  # a crash after the rename must not leave an empty binary behind
        os.replace(temp, binary())
        _fsync(folder)
        log.info("C guard built", path=str(binary()))
        return binary()
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def _run(command: list[str], timeout: float, owner: _Builder | None) -> str | None:
    """Run the compiler (its own process group, so killing it ends cc1 and the linker too); None when
    it succeeded, else why not (its last output line)."""
    if owner is not None and owner.stop.is_set():
        return "stopped"
    try:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0
        )
    except OSError as exc:
        return f"{command[0]}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, process.pid, 10)  # below the aggregator's own work
    if owner is not None and not owner.adopt(process):  # ended while it started
        _kill_group(process)
        return "stopped"
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return f"{TIMED_OUT} {timeout:.0f} s"
    finally:
        if owner is not None:
            owner.release(process)
    if process.returncode != 0:
        lines = output.decode(errors="replace").strip().splitlines() or [f"exit code {process.returncode}"]
        return lines[-1][:300]
    return None


def _check(temp: Path, key: str) -> str | None:
    """The binary runs here (not a noexec cache) and is this source's; None, or why not."""
    try:
        done = subprocess.run(
            [str(temp), "--version"], stdin=subprocess.DEVNULL, capture_output=True, timeout=CHECK_TIMEOUT_SECONDS
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the built guard does not run: {getattr(exc, 'strerror', None) or exc}"
    if done.stdout.decode(errors="replace").strip() != f"aggregator-guard {key}":
        return f"the built guard does not answer --version as expected (exit code {done.returncode})"
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _remove_stale_temps(folder: Path) -> None:
    now = time.time()
    for temp in folder.glob(".guard-*.tmp"):
        with contextlib.suppress(OSError):
            if now - temp.stat().st_mtime > STALE_TEMP_SECONDS:
                temp.unlink()


class _Builder:
    """The background build: at most one per process, started after a delay, with an owner that ends it
    (`stop_background_build`, called at exit)."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.running: list[subprocess.Popen[bytes]] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            if self.thread is not None or self.stop.is_set():
                return
            self.thread = threading.Thread(target=self._run, name="aggregator-guard-build", daemon=True)
            self.thread.start()
            atexit.register(self.end)  # `serve` leaves by os._exit: it calls stop_background_build itself

    def _run(self) -> None:
        if not self.stop.wait(BUILD_DELAY_SECONDS):
            build(self)

    def adopt(self, process: subprocess.Popen[bytes]) -> bool:
        """Hold a compiler that started, so `end` kills it; False when the build was ended meanwhile (the
        caller kills it): `end` never misses one."""
        with self.lock:
            if self.stop.is_set():
                return False
            self.running.append(process)
            return True

    def release(self, process: subprocess.Popen[bytes]) -> None:
        with self.lock:
            self.running.remove(process)

    def end(self, timeout: float = 5.0) -> None:
        with self.lock:
            self.stop.set()
            running = list(self.running)
        for process in running:
            _kill_group(process)
        thread = self.thread
        if thread is not None:
            thread.join(timeout)


_builder = _Builder()


def stop_background_build() -> None:
    """End a background build still running (the compiler killed, its temp file removed)."""
    _builder.end()
