"""A "browser" for the OAuth tests (`AGGREGATOR_BROWSER`): GET the URL, follow every redirect.

The test authorization server approves at once and redirects to the aggregator's loopback
callback, so following redirects completes the sign-in the way a user's click would.
"""

import sys

import httpx2

response = httpx2.get(sys.argv[-1], follow_redirects=True, timeout=20)
print(f"browser: {response.status_code}", file=sys.stderr)
