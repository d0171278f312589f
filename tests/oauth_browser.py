"""A "browser" for the OAuth tests (`AGGREGATOR_BROWSER`): GET the URL, follow every redirect.

The test authorization server approves at once and redirects to the aggregator's loopback
callback, so following redirects completes the sign-in the way a user's click would.

With `--tamper-state` it changes the `state` of the redirect back, as a forged callback would.
With `--deny` it comes back with `error=access_denied`, as when the user refuses; with
`--forged-deny` a refusal with another `state` comes first (another page's forgery), then the approval.
"""

import sys
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx2

url = sys.argv[-1]
asked = dict(parse_qsl(urlsplit(url).query))
for state in ["forged"] if "--forged-deny" in sys.argv else [asked["state"]] if "--deny" in sys.argv else []:
    refusal = {"error": "access_denied", "error_description": "the user said no", "state": state}
    response = httpx2.get(asked["redirect_uri"], params=refusal, timeout=20)
    print(f"browser: {response.status_code}", file=sys.stderr)
if "--deny" in sys.argv:
    sys.exit(0)
if "--tamper-state" in sys.argv:
    answer = httpx2.get(url, follow_redirects=False, timeout=20)
    back = urlsplit(answer.headers["location"])
    query = dict(parse_qsl(back.query)) | {"state": "forged"}
    url = back._replace(query=urlencode(query)).geturl()
response = httpx2.get(url, follow_redirects=True, timeout=20)
print(f"browser: {response.status_code}", file=sys.stderr)
