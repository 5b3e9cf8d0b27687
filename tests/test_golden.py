"""Committed compressed fixtures still inflate, bit for bit, to what they inflated to when made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from obsdelta_cli import inflate, verify
from obsdelta_cli.codecs import CODECS

from .golden_data import FORMATS, GOLDEN, leaf_hashes

EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


def test_every_format_and_codec_has_a_fixture() -> None:
    assert {(v["format"], v["codec"]) for v in EXPECTED.values()} == {
        (f, c) for f in FORMATS for c in CODECS
    }


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_fixture_inflates_to_recorded_bytes(name: str, tmp_path: Path) -> None:
    fixture = GOLDEN / name
    verify(fixture)
    back = tmp_path / name
    inflate(fixture, back)
    assert leaf_hashes(back) == EXPECTED[name]["inflated"]
