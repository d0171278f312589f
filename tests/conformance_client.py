"""The aggregator as the client under test of the MCP conformance suite's client scenarios.

The suite runs `python tests/conformance_client.py URL` with `MCP_CONFORMANCE_SCENARIO` (the
scenario's name) and, for some, `MCP_CONFORMANCE_CONTEXT` (JSON: client credentials, keys). This
writes a config whose one upstream is URL, the context turned into the config keys a user would
write, and runs the aggregator's own commands on it: `call` for a scenario that expects a tool
call, `list-upstreams --probe` otherwise. `AGGREGATOR_BROWSER` completes sign-ins
(tests/oauth_browser.py); tokens live in a data dir of this run only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2

HERE = Path(__file__).parent
CIMD_URL = "https://conformance-test.local/client-metadata.json"  # the suite's client ID metadata document
CALLS = {  # scenario → the tool call it expects (others: connect and list)
    "tools_call": ["add_numbers", "a=5", "b=3"],
    "sse-retry": ["test_reconnection"],
    "elicitation-sep1034-client-defaults": ["test_client_elicitation_defaults"],
}


def upstream(url: str, scenario: str, context: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"url": url, "timeouts": {"connect": 20, "call": 20}}
    if not scenario.startswith("auth/"):
        return entry
    if "idp_id_token" in context:  # SEP-990: the user configures the IdP and the authorization server
        entry |= {"auth": "identity_assertion", "issuer": authorization_server(url)}
        entry |= {"idp_token_endpoint": context["idp_token_endpoint"], "idp_id_token": "${CONFORMANCE_ID_TOKEN}"}
        entry |= {"idp_client_id": context.get("idp_client_id")} if context.get("idp_client_id") else {}
    elif scenario.startswith("auth/client-credentials"):
        entry["auth"] = "client_credentials"
        if "private_key_pem" in context:
            entry["client_private_key"] = "${CONFORMANCE_PRIVATE_KEY}"
            entry["client_signing_algorithm"] = context.get("signing_algorithm", "ES256")
    else:
        entry["auth"] = "oauth"
        entry["client_metadata_url"] = CIMD_URL
    if "client_id" in context:
        entry["client_id"] = context["client_id"]
    if "client_secret" in context:
        entry["client_secret"] = "${CONFORMANCE_CLIENT_SECRET}"
    return entry


def authorization_server(url: str) -> str:
    """The authorization server the scenario's MCP server names (a user would know it already)."""
    parts = urlsplit(url)
    metadata = f"{parts.scheme}://{parts.netloc}/.well-known/oauth-protected-resource{parts.path}"
    return str(httpx2.get(metadata, timeout=10).json()["authorization_servers"][0])


def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        config = Path(tmp) / "aggregator.yaml"
        config.write_text(json.dumps({"upstreams": {"up": upstream(url, scenario, context)}}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGGREGATOR_")}
        env |= {
            "AGGREGATOR_DATA_DIR": str(Path(tmp) / "data"),
            "AGGREGATOR_BROWSER": f"{sys.executable} {HERE / 'oauth_browser.py'}",
            "CONFORMANCE_CLIENT_SECRET": str(context.get("client_secret", "")),
            "CONFORMANCE_PRIVATE_KEY": str(context.get("private_key_pem", "")),
            "CONFORMANCE_ID_TOKEN": str(context.get("idp_id_token", "")),
        }
        call = CALLS.get(scenario, ["test-tool"] if scenario.startswith("auth/") else None)
        command = ["call", "up", *call] if call else ["list-upstreams", "--probe"]
        argv = [sys.executable, "-m", "aggregator", *command, "--config", str(config)]
        return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
