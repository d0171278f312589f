"""Cheap structural checks for the raw path's commonest shapes, in plain JSON terms.

The raw path must accept exactly the requests the SDK's validator accepts and write exactly
the results the SDK runner's sieve writes (`proxy/raw.py`). Both are pydantic validations,
the largest per-call cost left once the SDK's runner is gone. Most traffic has one shape: a
`tools/call` whose params are a name, an arguments object and perhaps a `_meta` object, and a
result that is a list of text items with an `isError` flag. For those shapes the answer of
pydantic is known in advance, for every handshake-era protocol version (what the raw path
serves):

- `tools_call_params_ok`: True only where `validate_client_request` surely accepts; anything
  else goes to the validator, which decides.
- `plain_text_result`: the sieved result (`serialize_server_result`'s output, equal as JSON)
  for the plain text shape, or None: then the sieve runs.

`tests/test_raw_checks.py` proves both against pydantic over generated inputs.
"""

from __future__ import annotations

from typing import Any

_PARAM_KEYS = frozenset({"name", "arguments", "_meta"})
_RESULT_KEYS = frozenset({"content", "isError"})
_TEXT_KEYS = frozenset({"type", "text"})


def tools_call_params_ok(params: Any) -> bool:
    """Whether `tools/call` params are surely valid: `name` a str, `arguments` an object (or absent,
    or null), `_meta` an object whose `progressToken`, if any, is a str or an int."""
    if type(params) is not dict or type(params.get("name")) is not str or not params.keys() <= _PARAM_KEYS:
        return False
    arguments = params.get("arguments")
    if arguments is not None and type(arguments) is not dict:
        return False
    if "_meta" not in params:
        return True
    meta = params["_meta"]
    if type(meta) is not dict:
        return False
    return "progressToken" not in meta or type(meta["progressToken"]) in (str, int)  # null is refused


def plain_text_result(result: Any) -> dict[str, Any] | None:
    """`result` itself when it is a plain `tools/call` result (text items only, `isError` a bool or
    absent): the sieve would give it back unchanged. None: another shape, for the sieve to judge."""
    if type(result) is not dict or not result.keys() <= _RESULT_KEYS:
        return None
    content = result.get("content")
    if type(content) is not list:
        return None
    if "isError" in result and type(result["isError"]) is not bool:
        return None
    for item in content:
        if (
            type(item) is not dict
            or item.keys() != _TEXT_KEYS
            or item["type"] != "text"
            or type(item["text"]) is not str
        ):
            return None
    return result
