"""The OAuth token store: tokens and registered clients of every remote upstream, on disk.

One JSON file in the data dir, readable by the user alone (0600 in a 0700 directory), keyed by
upstream name and bound to its URL (a changed URL is a different resource: its old tokens are not
sent there). `StoredTokens` is the SDK's `TokenStorage` over one upstream's entry. Every token and
client secret read or written is registered with the log's secrets mask.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mcp.client.auth import TokenStorage
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import ValidationError

from aggregator.files import write_atomically
from aggregator.log import get_logger, register_secrets

__all__ = ["STORE_NAME", "StoredTokens", "TokenStore"]

log = get_logger(__name__)

STORE_NAME = "oauth-tokens.json"


class TokenStore:
    """`<data dir>/oauth-tokens.json`: {upstream name: {url, tokens, expires_at, client, wanted_scope}}.

    Every read-modify-write holds an exclusive lock on a sibling lock file, so a sign-in and a
    serving process writing at once both keep their change. Without a path (no data dir) the
    entries live in memory, for as long as the process.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: dict[str, dict[str, Any]] = {}

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> TokenStore:
        return cls(data_dir / STORE_NAME)

    def read(self) -> dict[str, dict[str, Any]]:
        if self.path is None:
            return json.loads(json.dumps(self._memory))  # a copy, as a file read would give
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("token store unreadable; treating every upstream as signed out", error=type(exc).__name__)
            return {}
        if not isinstance(data, dict):
            return {}
        entries = {name: entry for name, entry in data.items() if isinstance(entry, dict)}
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

    def remove(self, name: str) -> bool:
        """Forget everything about `name`; True if there was something."""
        with self._locked():
            entries = self.read()
            if entries.pop(name, None) is None:
                return False
            self._write(entries)
            return True

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        if self.path is None:
            self._memory = entries
            return
        payload = json.dumps(entries, indent=1, sort_keys=True).encode()
        write_atomically(self.path, payload)  # mkstemp: created 0600
        os.chmod(self.path, 0o600)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _secrets_of(entries: Any) -> list[str]:
    found: list[Any] = []
    for entry in entries:
        tokens = entry.get("tokens") or {}
        client = entry.get("client") or {}
        found += [tokens.get("access_token"), tokens.get("refresh_token"), client.get("client_secret")]
    return [value for value in found if isinstance(value, str) and value]


class StoredTokens(TokenStorage):
    """The SDK's `TokenStorage` over one upstream's entry of the `TokenStore`.

    `expires_in` is stored as an absolute `expires_at` and handed back as the seconds left, so a
    token loaded later keeps its expiry. A configured client (client_id) is never written.
    """

    def __init__(
        self, store: TokenStore, name: str, url: str | None, client: OAuthClientInformationFull | None
    ) -> None:
        self._store = store
        self._name = name
        self._url = url
        self._client = client

    async def get_tokens(self) -> OAuthToken | None:
        entry = self._store.entry(self._name, self._url)
        try:
            tokens = OAuthToken.model_validate(entry["tokens"]) if "tokens" in entry else None
        except ValidationError:
            return None
        if tokens is not None and isinstance(expires_at := entry.get("expires_at"), int | float):
            tokens.expires_in = int(expires_at - time.time())
        return tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        expires_at = time.time() + int(tokens.expires_in) if tokens.expires_in is not None else None
        self._store.update(
            self._name, self._url, tokens=tokens.model_dump(mode="json", exclude_none=True), expires_at=expires_at
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self._client is not None:
            return self._client
        entry = self._store.entry(self._name, self._url)
        try:
            return OAuthClientInformationFull.model_validate(entry["client"]) if "client" in entry else None
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self._client is None:
            self._store.update(self._name, self._url, client=client_info.model_dump(mode="json", exclude_none=True))
