"""loadtest/null_shard.patch (the floor of the gateway-and-shard design, RESULTS.md, issue 32)
must keep applying to the channel it patches, or its documented command stops working."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_null_shard_patch_applies_to_the_channel_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "actors").mkdir()
    shutil.copy(ROOT / "actors" / "channel.py", tmp_path / "actors" / "channel.py")
    patch = ROOT / "loadtest" / "null_shard.patch"
    done = subprocess.run(
        ["git", "apply", str(patch)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    patched = (tmp_path / "actors" / "channel.py").read_text()
    assert "EVQ_NULL_SHARD" in patched
    assert "_NULL.add(self, request)" in patched
    compile(patched, "channel.py", "exec")  # still Python
