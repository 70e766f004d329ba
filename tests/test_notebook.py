"""The quick-start notebook runs top to bottom in a real kernel."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NB = Path(__file__).resolve().parent.parent / "notebooks" / "01-quickstart.ipynb"


def test_quickstart_notebook_executes():
    nb = nbformat.read(NB, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NB.parent)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "bytes identical: True" in text and "RPC0" in text
    pictures = [o["data"]["image/svg+xml"] for c in nb.cells if c.cell_type == "code"
                for o in c.outputs if "image/svg+xml" in o.get("data", {})]
    assert len(pictures) == 1 and "SOFT_MAX" in pictures[0] and "MUL_MAT" in pictures[0]
