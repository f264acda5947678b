"""Fuzzing the config loader with hypothesis: whatever a YAML file or a --set holds, the loader either
returns a valid config or raises ConfigError with one line naming the file or option — never anything
else, which the CLI would print as a traceback."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.errors import ConfigError
from lab.run import config

SECTIONS = {
    f.name: [k.name for k in dataclasses.fields(f.type if isinstance(f.type, type) else getattr(config, f.type))]
    for f in dataclasses.fields(config.Config)
    if f.name != "origin"
}
NAMES = sorted(SECTIONS) + sorted({k for keys in SECTIONS.values() for k in keys}) + ["", "0", "null", "~"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=30)
    | st.sampled_from(NAMES)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# Mostly the real shape (known sections and keys, hostile values), sometimes anything at all.
documents = (
    st.dictionaries(
        st.sampled_from(sorted(SECTIONS)),
        st.dictionaries(st.sampled_from(NAMES), values, max_size=5) | values,
        max_size=4,
    )
    | values
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _load_text(text: str):
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        return path, config.load(path)
    except ConfigError as exc:
        return path, exc
    finally:
        os.unlink(path)


def _assert_clear(outcome, where: str) -> None:
    if isinstance(outcome, ConfigError):
        message = str(outcome)
        assert message and "\n" not in message, message
        assert where in message, message


@FUZZ
@given(documents)
def test_any_yaml_document_loads_or_is_refused_in_one_line(document):
    path, outcome = _load_text(yaml.safe_dump(document, allow_unicode=True))
    _assert_clear(outcome, os.path.basename(path))
    if not isinstance(outcome, ConfigError):
        assert isinstance(outcome, config.Config)


@FUZZ
@given(st.text(max_size=200))
def test_any_text_loads_or_is_refused_in_one_line(text):
    path, outcome = _load_text(text)
    _assert_clear(outcome, os.path.basename(path))


@FUZZ
@given(
    st.lists(
        st.text(max_size=40)
        | st.builds(
            lambda s, k, v: f"{s}.{k}={v}",
            st.sampled_from(sorted(SECTIONS)),
            st.sampled_from(NAMES),
            st.text(max_size=12),
        ),
        max_size=3,
    )
)
def test_any_override_is_applied_or_refused_in_one_line(overrides):
    try:
        assert isinstance(config.load(None, overrides), config.Config)
    except ConfigError as exc:
        assert "\n" not in str(exc) and "--set" in str(exc), str(exc)
