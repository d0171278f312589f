"""The OAuth token store: tokens and registered clients of every remote upstream, kept per user.

Two places can hold them: the system keyring (the optional `keyring` package, where a usable
backend exists) or one JSON file in the data dir, readable by the user alone (0600; the data dir
is 0700 only if the store created it: snapshots usually did first). `AGGREGATOR_TOKEN_STORE`
chooses: `file`, `keyring`, or `auto` (the default: the keyring when a system keyring is there,
else the file). Whatever is found in the other place is moved into
the chosen one on first use, so switching loses nothing; `remove` clears both.

Entries are keyed by upstream name and bound to its URL (a changed URL is a different resource:
its old tokens are not sent there). `StoredTokens` is the SDK's `TokenStorage` over one upstream's
entry. Every token and client secret read or written is registered with the log's secrets mask.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from aggregator.files import write_atomically
from aggregator.log import get_logger, register_secrets

if TYPE_CHECKING:  # the SDK's OAuth models (0.3 MB) load with the first stored token or client read
    from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

__all__ = ["STORE_CHOICES", "STORE_NAME", "TOKEN_STORE_ENV", "StoredTokens", "TokenStore", "TokenStoreError"]

log = get_logger(__name__)

STORE_NAME = "oauth-tokens.json"
STAMP_SUFFIX = ".stamp"  # beside the store: rewritten on every change, so a serving process notices with one stat
TOKEN_STORE_ENV = "AGGREGATOR_TOKEN_STORE"
STORE_CHOICES = ("auto", "file", "keyring")
KEYRING_SERVICE = "aggregator-oauth"

Entries = dict[str, dict[str, Any]]


class TokenStoreError(Exception):
    """The chosen token store cannot be used (e.g. `keyring` chosen, and no keyring is usable)."""


class _Place(Protocol):
    """Where entries are kept: `load` all, `save` all."""

    def load(self) -> Entries: ...

    def save(self, entries: Entries) -> None: ...

    def describe(self) -> str: ...


class _File:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Entries:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("token store unreadable; treating every upstream as signed out", error=type(exc).__name__)
            return {}
        if not isinstance(data, dict):
            return {}
        return {name: entry for name, entry in data.items() if isinstance(entry, dict)}

    def save(self, entries: Entries) -> None:
        write_atomically(self.path, json.dumps(entries, indent=1, sort_keys=True).encode())  # mkstemp: 0600
        os.chmod(self.path, 0o600)

    def describe(self) -> str:
        return f"file {self.path} (mode 0600)"


class _Keyring:
    """One keyring entry per upstream (`<scope>:<name>`) and an index of the names (`<scope>`); the
    scope is the file path the data dir would use, so two data dirs never share tokens."""

    def __init__(self, backend: Any, scope: str) -> None:
        self.backend = backend
        self.scope = scope

    def _get(self, key: str) -> Any:
        """The JSON stored under `key`, or None (absent or unreadable: treated as signed out)."""
        raw = self.backend.get_password(KEYRING_SERVICE, key)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            log.warning("keyring entry unreadable; treating it as signed out")
            return None

    def _names(self) -> list[str]:
        names = self._get(self.scope)
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def load(self) -> Entries:
        entries: Entries = {}
        for name in self._names():
            entry = self._get(f"{self.scope}:{name}")
            if isinstance(entry, dict):
                entries[name] = entry
        return entries

    def save(self, entries: Entries) -> None:
        for name in set(self._names()) - set(entries):
            with contextlib.suppress(Exception):  # already gone
                self.backend.delete_password(KEYRING_SERVICE, f"{self.scope}:{name}")
        for name, entry in entries.items():
            self.backend.set_password(KEYRING_SERVICE, f"{self.scope}:{name}", json.dumps(entry, sort_keys=True))
        if entries:
            self.backend.set_password(KEYRING_SERVICE, self.scope, json.dumps(sorted(entries)))
        else:
            with contextlib.suppress(Exception):
                self.backend.delete_password(KEYRING_SERVICE, self.scope)

    def describe(self) -> str:
        kind = type(self.backend)
        return f"keyring {kind.__module__}.{kind.__name__}"


def keyring_backend(*, system_only: bool) -> tuple[Any | None, str]:
    """The keyring backend to use and, when there is none, why. `system_only` (auto): a keyring of the
    system (priority >= 1, not a file of keyrings.alt), not a fallback that is no better than our file."""
    try:
        import keyring
        import keyring.core
        from keyring.backends.chainer import ChainerBackend
    except ImportError:
        return None, "the keyring package is not installed (pip install 'aggregator[keyring]')"
    try:
        backend = keyring.core.load_env() or keyring.get_keyring()
    except Exception as exc:
        return None, f"the keyring backend could not load: {type(exc).__name__}"
    chained = list(backend.backends) if isinstance(backend, ChainerBackend) else [backend]

    def usable(one: Any) -> bool:
        priority = float(getattr(one, "priority", 0))
        if system_only:
            return priority >= 1 and not type(one).__module__.startswith("keyrings.alt")
        return priority > 0

    if not any(usable(one) for one in chained):
        name = f"{type(backend).__module__}.{type(backend).__name__}"
        return None, f"no {'system ' if system_only else 'usable '}keyring backend ({name})"
    return backend, ""


class TokenStore:
    """{upstream name: {url, tokens, expires_at, client, wanted_scope}}, in the keyring or the file.

    Every read-modify-write holds an exclusive lock on a file beside `path`, so a sign-in and a
    serving process writing at once both keep their change. Without a path (no data dir) the
    entries live in memory, for as long as the process. `choice`: file, keyring or auto (None:
    `AGGREGATOR_TOKEN_STORE`, else auto); the place is settled on first use.
    """

    def __init__(self, path: Path | None, choice: str | None = None) -> None:
        self.path = path
        self.choice = choice or os.environ.get(TOKEN_STORE_ENV, "").strip().lower() or "auto"
        self._memory: dict[str, dict[str, Any]] = {}
        self._place: _Place | None = None
        self._other: _Place | None = None  # where entries of an earlier choice may still be
        self._why_not_keyring = ""
        self._lock_depth = 0  # flock is per open file: a nested hold must not open it again
        self._changes = 0  # the stamp of a store without a path

    @classmethod
    def in_data_dir(cls, data_dir: Path, choice: str | None = None) -> TokenStore:
        return cls(data_dir / STORE_NAME, choice)

    def where(self) -> str:
        """Which store holds the tokens (for `auth status` and `doctor`), never what is in it."""
        if self.path is None:
            return "memory (no data dir)"
        if (why := self.unusable()) is not None:
            return f"none: {why}"
        note = f"; keyring not used: {self._why_not_keyring}" if self._why_not_keyring and self.choice == "auto" else ""
        return self._settled().describe() + note

    def unusable(self) -> str | None:
        """Why the chosen store cannot keep any token (a bad choice, `keyring` without one), else None."""
        if self.path is None:
            return None
        try:
            self._settled()
        except TokenStoreError as exc:
            return str(exc)
        return None

    def stamp(self) -> object:
        """Something that differs after any change to the store, by this process or another (`auth logout`
        in another terminal): one `stat` of the stamp file beside it, whichever place holds the tokens."""
        if self.path is None:
            return self._changes
        try:
            found = os.stat(self.path.with_suffix(STAMP_SUFFIX))
        except OSError:
            return None
        return (found.st_ino, found.st_mtime_ns, found.st_size)

    def _changed(self) -> None:
        """Say that the store changed: the stamp file is replaced (a new inode, mtime and content)."""
        self._changes += 1
        if self.path is not None:
            with contextlib.suppress(OSError):  # the tokens are written: a stale stamp only delays a notice
                stamp = f"{time.time_ns()} {os.getpid()} {self._changes}\n"  # no secret: when, by whom
                write_atomically(self.path.with_suffix(STAMP_SUFFIX), stamp.encode())

    def read(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return json.loads(json.dumps(self._memory))  # a copy, as a file read would give
        entries = self._settled().load()
        register_secrets(_secrets_of(entries.values()))
        return entries

    def entry(self, name: str, url: str | None) -> dict[str, Any]:
        """The entry of `name` if it was made for `url` (a changed URL starts afresh), else {}."""
        entry = self.read().get(name, {})
        return entry if entry.get("url") == url else {}

    def update(self, name: str, url: str | None, **fields: Any) -> None:
        """Set `fields` in the entry of `name` (None removes a field); a different URL starts a new entry."""
        register_secrets(_secrets_of([fields]))
        with self._locked():
            entries = self.read()
            entry = entries.get(name, {})
            if entry.get("url") != url:
                entry = {"url": url}
            for key, value in fields.items():
                if value is None:
                    entry.pop(key, None)
                else:
                    entry[key] = value
            entries[name] = entry
            self._write(entries)
            self._changed()

    def remove(self, name: str) -> bool:
        """Forget everything about `name`, in both stores; True if there was something."""
        with self._locked():
            entries = self.read()
            found = entries.pop(name, None) is not None
            if found:
                self._write(entries)
            if self._other is not None:
                with contextlib.suppress(Exception):  # the other store may be unreachable: ours is clean
                    others = self._other.load()
                    if others.pop(name, None) is not None:
                        self._other.save(others)
                        found = True
            if found:
                self._changed()
            return found

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        if self.path is None:
            self._memory = entries
            return
        self._settled().save(entries)

    def _settled(self) -> _Place:
        """The chosen place, settled once; entries left in the other place are moved in first."""
        if self._place is not None:
            return self._place
        assert self.path is not None
        if self.choice not in STORE_CHOICES:
            raise TokenStoreError(f"{TOKEN_STORE_ENV}={self.choice!r}: choose one of {', '.join(STORE_CHOICES)}")
        file = _File(self.path)
        backend = None
        if self.choice != "file":
            backend, self._why_not_keyring = keyring_backend(system_only=self.choice == "auto")
        if self.choice == "keyring" and backend is None:
            raise TokenStoreError(f"{TOKEN_STORE_ENV}=keyring, but {self._why_not_keyring}")
        if backend is not None:
            self._place, self._other = _Keyring(backend, str(self.path)), file
        else:  # the file; tokens an earlier choice left in any keyring come over
            earlier, _ = keyring_backend(system_only=False)
            self._place, self._other = file, _Keyring(earlier, str(self.path)) if earlier is not None else None
        self._move_in()
        return self._place

    def _move_in(self) -> None:
        """Entries of the other place that ours lacks come over; then the other place forgets them."""
        other, place = self._other, self._place
        if other is None or place is None:
            return
        try:
            with self._locked():
                found = other.load()
                if not found:
                    return
                entries = place.load()
                moved = {name: entry for name, entry in found.items() if name not in entries}
                place.save(entries | moved)
                other.save({})
        except Exception as exc:  # an unreachable keyring must not stop the other store from working
            log.warning("tokens of the other store not moved", error=type(exc).__name__)
            return
        log.info("tokens moved between stores", upstreams=len(moved), to=place.describe())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path is None or self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_depth = 1
            yield
        finally:
            self._lock_depth = 0
            os.close(fd)


def _secrets_of(entries: Any) -> list[str]:
    found: list[Any] = []
    for entry in entries:
        tokens = entry.get("tokens") or {}
        client = entry.get("client") or {}
        found += [tokens.get("access_token"), tokens.get("refresh_token"), client.get("client_secret")]
    return [value for value in found if isinstance(value, str) and value]


class StoredTokens:
    """The SDK's `TokenStorage` over one upstream's entry of the `TokenStore`.

    A `typing.Protocol`, met by shape (checked by mypy where a provider is given one), not subclassed:
    the SDK's `mcp.client.auth` imports httpx2, which a `serve` with no remote upstream never loads.

    `expires_in` is stored as an absolute `expires_at` and handed back as the seconds left, so a
    token loaded later keeps its expiry. A configured client (client_id) is never written. Tokens
    are written together with the client they were issued to: two sign-ins at once (two serving
    processes, or `auth login` beside a link offered to a client) may register two clients, and
    the entry must never pair one's tokens with the other's registration.
    """

    def __init__(
        self, store: TokenStore, name: str, url: str | None, client: OAuthClientInformationFull | None
    ) -> None:
        self._store = store
        self._name = name
        self._url = url
        self._client = client
        self._used: OAuthClientInformationFull | None = None  # the registered client this provider uses
        self._held = False  # it read or wrote tokens: their entry gone later means `auth logout` ran meanwhile
        self._seen = store.stamp()  # the store's stamp when this provider last looked at its entry

    async def get_tokens(self) -> OAuthToken | None:
        from mcp.shared.auth import OAuthToken

        entry = self._store.entry(self._name, self._url)
        try:
            tokens = OAuthToken.model_validate(entry["tokens"]) if "tokens" in entry else None
        except ValidationError:
            return None
        if tokens is not None and isinstance(expires_at := entry.get("expires_at"), int | float):
            tokens.expires_in = int(expires_at - time.time())
        self._held = self._held or tokens is not None
        return tokens

    def signed_out(self) -> bool:
        """True once the tokens this provider held are gone from the store (`auth logout`, here or in another
        process): the provider must not send them again. One `stat` while the store is unchanged."""
        stamp = self._store.stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        return self._tokens_gone()

    def _tokens_gone(self) -> bool:
        """This provider held tokens, and the store's entry no longer has any."""
        return self._held and not self._store.entry(self._name, self._url).get("tokens")

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Keep `tokens`; unless this provider held tokens whose entry is gone since (a refresh after
        `auth logout`): writing them would undo the logout, so the upstream needs a sign-in instead."""
        if self._tokens_gone():
            from aggregator.upstream.oauth_signin import SignInRequired  # it imports this module

            self._held = False
            raise SignInRequired(self._name, " (signed out meanwhile)")
        self._held = True
        expires_at = time.time() + int(tokens.expires_in) if tokens.expires_in is not None else None
        issued_to = {"client": self._used.model_dump(mode="json", exclude_none=True)} if self._used else {}
        self._store.update(
            self._name,
            self._url,
            tokens=tokens.model_dump(mode="json", exclude_none=True),
            expires_at=expires_at,
            **issued_to,
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self._client is not None:
            return self._client
        from mcp.shared.auth import OAuthClientInformationFull

        entry = self._store.entry(self._name, self._url)
        try:
            self._used = OAuthClientInformationFull.model_validate(entry["client"]) if "client" in entry else None
        except ValidationError:
            self._used = None
        return self._used

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self._client is None:
            self._used = client_info
            self._store.update(self._name, self._url, client=client_info.model_dump(mode="json", exclude_none=True))
