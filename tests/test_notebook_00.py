"""The quickstart (`make demo`) runs headless in quick mode: its own checks pass, the only
errors are in the cells that fail on purpose (tagged raises-exception), the world stops."""

from __future__ import annotations

import nbformat
from conftest import NOTEBOOKS, run_quick


def test_quickstart_runs_headless_and_passes_its_checks(tmp_path):
    committed = nbformat.read(str(NOTEBOOKS / "00_quickstart.ipynb"), as_version=4)
    nbformat.validate(committed)
    for cell in committed.cells:  # stored without outputs
        assert not cell.get("outputs") and cell.get("execution_count") is None, cell.source
    nb, text, _ = run_quick("00_quickstart.ipynb", timeout=300, cwd=tmp_path)
    for cell in nb.cells:
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        tagged = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        assert not errors or tagged, (cell.source, errors)
    assert "quickstart checks passed" in text and "nbdist: stopped" in text
    assert "[obs2]" in text and "[obs1]" in text
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert made and all(p.startswith("_out/") and p.endswith(".png") for p in made), made
