"""`Settings` reads the environment as pydantic-settings would (it no longer imports it: issue 24, memory).

Proved against pydantic-settings itself (when installed) over generated environments: names in any
case, empty values, valid and invalid strings for every field, unrelated variables, keyword arguments.
"""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError, create_model

from aggregator.settings import Settings

pydantic_settings = pytest.importorskip("pydantic_settings")


class _Base(pydantic_settings.BaseSettings):  # type: ignore[misc]
    model_config = pydantic_settings.SettingsConfigDict(env_prefix="AGGREGATOR_", env_ignore_empty=True, extra="ignore")


Reference: Any = create_model(  # the same fields, read by pydantic-settings
    "Reference", __base__=_Base, **{name: (field.annotation, field) for name, field in Settings.model_fields.items()}
)

SAMPLES = ["", "0", "1", "12", "2048", "1.5", "-3", "nan", "info", "INFO", " Debug ", "loud", "auto", "file"]
SAMPLES += ["keyring", "/tmp/x", "~/conf.yaml", "true", "none", "null", "s3cret", "1e3", "０", "9" * 30]
VALUES = st.sampled_from(SAMPLES) | st.text(max_size=8)
LEVEL = ("log_level",)


@st.composite
def environments(draw: st.DrawFn) -> dict[str, str]:
    names = draw(st.lists(st.sampled_from(sorted(Settings.model_fields)), max_size=6, unique=True))
    env = {}
    for name in names:
        key = "AGGREGATOR_" + name.upper()
        key = "".join(c.lower() if draw(st.booleans()) else c for c in key) if draw(st.booleans()) else key
        env[key] = draw(VALUES)
    if draw(st.booleans()):
        env["AGGREGATOR_PYTHON"] = "/usr/bin/python3"  # not a setting
    return {key: value.replace("\x00", "") for key, value in env.items()}


def _outcome(make: Any) -> tuple[str, Any]:
    try:
        return "ok", make().model_dump()
    except ValidationError as exc:
        return "error", {error["loc"] for error in exc.errors(include_url=False)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=environments(), kwargs=st.dictionaries(st.sampled_from(["log_level", "max_in_flight"]), VALUES, max_size=1))
def test_settings_read_the_environment_as_pydantic_settings_does(env: dict[str, str], kwargs: dict[str, str]) -> None:
    base = {key: value for key, value in os.environ.items() if not key.lower().startswith("aggregator_")}
    with mock.patch.dict(os.environ, {**base, **env}, clear=True):
        ours = _outcome(lambda: Settings(**kwargs))
        theirs = _outcome(lambda: Reference(**kwargs))
    if theirs[0] == "ok" and ours[0] == "ok":
        assert ours[1] == {**theirs[1], "log_level": theirs[1]["log_level"].strip().lower()}
    elif theirs[0] == "ok":  # our validator refuses more than the field's type: an unknown level only
        assert ours[1] == {LEVEL}, (ours, theirs)
    else:
        assert ours[0] == "error" and ours[1] - {LEVEL} == theirs[1] - {LEVEL}, (ours, theirs)
