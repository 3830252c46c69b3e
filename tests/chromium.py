"""A real headless Chromium for the web-view tests: where it is, the skip mark, and the rendered DOM."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
)
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not on PATH (Debian/Ubuntu: apt-get install chromium)"
)


def dom(url: str, profile: Path, budget_ms: int = 8000) -> str:
    """The page's DOM after its scripts ran for `budget_ms` of virtual time. The flags keep a root,
    offline, headless browser from reaching out (no sandbox as root, no background networking)."""
    assert CHROMIUM is not None
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
        capture_output=True, text=True, timeout=90,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
