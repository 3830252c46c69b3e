"""Golden tests over /proc/<pid>/cgroup files in the shapes real nodes write (corpus/cgroup.yaml):
each case names the runtime, driver, version and distribution it stands for, and its source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from periscope.core.cgroup import parse_cgroup

CORPUS = Path(__file__).parent / "data" / "corpus"
CASES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "cgroup.yaml").read_text())["cases"]


def test_every_case_names_its_source() -> None:
    assert len(CASES) >= 12
    for case in CASES:
        assert set(case) == {"name", "source", "text", "expect"}, case["name"]
        assert len(case["source"]) > 20, case["name"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_real_cgroup_shape(case: dict[str, Any]) -> None:
    got = parse_cgroup(case["text"]).to_json()
    del got["path"]
    assert got == case["expect"]
