"""The quickstart (`make demo`) runs headless in quick mode: its own checks pass, the only
errors are in the cells that fail on purpose (tagged raises-exception), the world stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


DRAW_REWARDS = r'''
import json, os, sys
import matplotlib
matplotlib.use("Agg")
import nbdist

nbdist.history = lambda key=None: [{"rank": r, "name": f"obs{r}", "step": s,
                                    "reward": float((s * r) % 7)} for r in (1, 2)
                                   for s in range(50)]
ns = {"os": os}
exec(sys.argv[1], ns)
fig, ax = ns["fig"], ns["ax"]
renderer = fig.canvas.get_renderer()
box = fig.bbox
texts = [ax.xaxis.label, ax.yaxis.label, ax.title]
cut = [t.get_text() for t in texts if t.get_text() and not (
    box.x0 <= (e := t.get_window_extent(renderer)).x0 and e.x1 <= box.x1
    and box.y0 <= e.y0 and e.y1 <= box.y1)]
print("CUT " + json.dumps(cut))
'''


def test_the_rewards_plot_keeps_its_labels_inside(tmp_path):
    """The cell that saves ``_out/quickstart_rewards.png`` (issue 27, 5e: its x label was cut
    off): both axis labels and the title lie inside the figure it saves."""
    committed = nbformat.read(str(NOTEBOOKS / "00_quickstart.ipynb"), as_version=4)
    cell = next(c.source for c in committed.cells if "quickstart_rewards.png" in c.source)
    proc = subprocess.run([sys.executable, "-c", DRAW_REWARDS, cell], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "MPLBACKEND": "Agg", "NBDIST_PREWARM": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "_out" / "quickstart_rewards.png").is_file()
    cut = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("CUT "))[4:])
    assert cut == [], f"cut off at the figure's edge: {cut}"
