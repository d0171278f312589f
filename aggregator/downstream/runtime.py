"""Where the per-user service lives: a private runtime directory and the files of one service.

One service runs per user and per (config file, data directory): `aggregator connect`
computes the same key as the service it starts, so every client naming the same config
reaches the same process. Standard library only: `connect` imports this and must start
in a few tens of milliseconds.

Files of the service with key K, all in the runtime directory (mode 0700, owned by us):
``K.sock`` the MCP socket, ``K.ctl`` its status socket, ``K.pid`` held locked by the
running service (its pid, config and start time inside), ``K.start`` the lock two
racing `connect`s take to start exactly one service, ``K.log`` the service's log.
"""

from __future__ import annotations

import _socket  # not `socket`: its enum conversions cost ~15 ms of `connect`'s start
import os
import stat

TYPE_CHECKING = False  # not `from typing import ...`: typing imports re, ~5 ms of `connect`'s start
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "RUNTIME_DIR_ENV",
    "ServiceFiles",
    "connect_target",
    "private_dir",
    "read_pid_file",
    "runtime_dir",
    "service_files",
    "service_running",
    "try_connect",
]

try:  # the builtin SHA-256 rather than hashlib's OpenSSL one: ~3 ms less of `connect`'s start
    from _sha2 import sha256  # type: ignore[import-not-found,unused-ignore]  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]  # Python 3.11
    except ImportError:  # pragma: no cover - a build without them
        from hashlib import sha256  # type: ignore[assignment,unused-ignore]

RUNTIME_DIR_ENV = "AGGREGATOR_RUNTIME_DIR"
CONFIG_FILE_NAME = "aggregator.yaml"  # as config.config_file.CONFIG_FILE_NAME, which needs platformdirs


def runtime_dir(environ: Mapping[str, str] | None = None) -> str:
    """``$AGGREGATOR_RUNTIME_DIR`` > ``$XDG_RUNTIME_DIR/aggregator`` > ``<tmp>/aggregator-<uid>``."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(RUNTIME_DIR_ENV, "")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "aggregator")
    import tempfile  # only here: ~5 ms

    return os.path.join(tempfile.gettempdir(), f"aggregator-{os.getuid()}")


def private_dir(path: str) -> str:
    """`path` as a directory only we can enter: created 0700, or an existing one checked and tightened.

    A directory someone else owns, or a symlink in its place (a shared /tmp), is refused:
    whoever controls it could put their socket where our clients look for ours.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:  # noqa: SIM105 - contextlib costs start-up time here
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} is not a directory owned by this user; remove it or set {RUNTIME_DIR_ENV} to another place"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


class ServiceFiles:
    """The files of one service (see the module docstring), as absolute path strings."""

    __slots__ = ("control", "directory", "key", "log", "pid", "socket", "start_lock")

    def __init__(self, key: str, directory: str) -> None:
        self.key, self.directory = key, directory
        base = os.path.join(directory, key)
        self.socket, self.control, self.pid = f"{base}.sock", f"{base}.ctl", f"{base}.pid"
        self.start_lock, self.log = f"{base}.start", f"{base}.log"


def service_files(config: str | None, data_dir: str | None, environ: Mapping[str, str] | None = None) -> ServiceFiles:
    """The files of the service for this config file (None: the user's or the built-in default) and data dir."""
    identity = f"{config or ''}\0{data_dir or ''}".encode()
    return ServiceFiles(sha256(identity).hexdigest()[:16], runtime_dir(environ))


def connect_target(
    config: str | None, data_dir: str | None, environ: Mapping[str, str], cwd: str
) -> tuple[str | None, str | None]:
    """(config file, data dir) that identify the service, resolved as `serve` would find them.

    ``--config`` > ``AGGREGATOR_CONFIG`` > ``./aggregator.yaml``, made absolute; None when none
    of those applies (the service then reads the user config file or the built-in default).
    The data dir is ``--data-dir`` > ``AGGREGATOR_DATA_DIR``, or None for the default.
    """

    def absolute(text: str) -> str:
        return os.path.join(cwd, os.path.expanduser(text))  # an absolute second part wins

    chosen = config or environ.get("AGGREGATOR_CONFIG", "")
    if chosen:
        found: str | None = absolute(chosen)
    else:
        local = os.path.join(cwd, CONFIG_FILE_NAME)
        found = local if os.path.isfile(local) else None
    data = data_dir or environ.get("AGGREGATOR_DATA_DIR", "")
    return found, absolute(data) if data else None


def read_pid_file(path: str) -> dict[str, Any] | None:
    """What a service wrote in its pid file, or None when there is none (or it is unreadable)."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def service_running(pid_file: str) -> bool:
    """True while a service holds the lock of `pid_file` (the kernel drops it when the service dies)."""
    import fcntl  # not at the top: the CLI imports this module on Windows too, where there is no service

    try:
        fd = os.open(pid_file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def try_connect(path: str) -> _socket.socket | None:
    """A connection to the Unix socket at `path`, or None: no file, or nobody listening (a stale socket)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock
