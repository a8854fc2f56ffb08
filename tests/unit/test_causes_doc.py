"""docs/causes.md is generated from the known-issues table and committed up to date."""

import subprocess
import sys

from tests.conftest import ROOT


def test_the_committed_causes_doc_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_causes_doc.py"), "--check"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr


def test_the_doc_documents_every_known_issue():
    from lossguard.knowledge import ISSUES

    text = (ROOT / "docs" / "causes.md").read_text()
    for issue in ISSUES.values():
        assert f"## `{issue.id}`" in text and issue.fix in text
    assert "KNOWLEDGE" not in text
