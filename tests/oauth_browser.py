"""A "browser" for the OAuth tests (`AGGREGATOR_BROWSER`): GET the URL, follow every redirect.

The test authorization server approves at once and redirects to the aggregator's loopback
callback, so following redirects completes the sign-in the way a user's click would.

With `--tamper-state` it changes the `state` of the redirect back, as a forged callback would.
"""

import sys
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx2

url = sys.argv[-1]
if "--tamper-state" in sys.argv:
    answer = httpx2.get(url, follow_redirects=False, timeout=20)
    back = urlsplit(answer.headers["location"])
    query = dict(parse_qsl(back.query)) | {"state": "forged"}
    url = back._replace(query=urlencode(query)).geturl()
response = httpx2.get(url, follow_redirects=True, timeout=20)
print(f"browser: {response.status_code}", file=sys.stderr)
