"""The notebooks run top to bottom in a real kernel, and what they print and show is checked:
the numbers that matter (errors against numpy, split counts, accuracies), the pictures
(SVG graphs, HTML displays, matplotlib figures). Each starts a kernel (and RPC servers), so
they are marked slow: ``-m "not slow"`` leaves them out, CI runs them."""
import os
import re
from pathlib import Path

import pytest

import ggml_py as gg

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
WIRED = hasattr(gg.Device, "_repr_html_") and hasattr(gg.Scheduler, "_repr_html_")


class Ran:
    """A notebook after execution: its cells' outputs by kind."""

    def __init__(self, nb):
        self.cells = [c for c in nb.cells if c.cell_type == "code"]
        self.outputs = [o for c in self.cells for o in c.outputs]

    @property
    def text(self) -> str:
        out = []
        for o in self.outputs:
            out.append(o.get("text", ""))
            out.append(o.get("data", {}).get("text/plain", ""))
        return "\n".join(out)

    def data(self, mime: str) -> list[str]:
        return [o["data"][mime] for o in self.outputs if mime in o.get("data", {})]

    def number(self, pattern: str) -> float:
        m = re.search(pattern, self.text)
        assert m, f"{pattern!r} not in the notebook's output:\n{self.text[-2000:]}"
        return float(m.group(1))


def run(name: str, monkeypatch) -> Ran:
    # the kernel is another process: it finds this checkout through PYTHONPATH
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return Ran(nb)


# notebooks 01-05 address the RPC servers' devices as RPC0 and RPC1, ggml's names since 0.10
# (0.9.x names each "RPC[host:port]", one per server): on 0.9.x they skip, saying so
import ggml_py as _gg                                                    # noqa: E402
rpc_names = pytest.mark.skipif(
    _gg._features.old_rpc_api(),
    reason="the notebooks name RPC devices RPC0, RPC1: ggml's names since 0.10 (this build is "
           f"{_gg.ggml_version()}, whose RPC devices are named RPC[host:port])")


def test_every_notebook_is_tested():
    tested = {"01-quickstart.ipynb", "02-devices-buffers.ipynb", "03-events-async.ipynb",
              "04-scheduler.ipynb", "05-gguf.ipynb", "06-training.ipynb",
              "07-tensor-parallel.ipynb"}
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == tested


@pytest.mark.slow
@rpc_names
def test_01_quickstart(monkeypatch):
    nb = run("01-quickstart.ipynb", monkeypatch)
    assert "bytes identical: True" in nb.text and "RPC0" in nb.text
    for name in ("CPU", "RPC0"):
        assert nb.number(rf"{name}\s+NMSE ([\d.e+-]+)") < 5e-4
    pictures = nb.data("image/svg+xml")
    assert len(pictures) == 1 and "SOFT_MAX" in pictures[0] and "MUL_MAT" in pictures[0]
    assert "dot -Tpng" not in nb.text
    if WIRED:
        assert "marker" in pictures[0]                   # edges end in arrowheads
        assert any("Devices" in h and "RPC0" in h for h in nb.data("text/html"))


@pytest.mark.slow
@rpc_names
def test_02_devices_buffers_zero_copy(monkeypatch):
    nb = run("02-devices-buffers.ipynb", monkeypatch)
    assert "same address: True | numpy view shares memory: True" in nb.text
    assert "row sums before: [ 30. 102. 174. 246.]" in nb.text
    assert "row sums after:  [1200.  102.  174.  246.]" in nb.text   # numpy's write, seen by ggml
    assert "RPC0 refuses:" in nb.text and "cannot make buffers from host memory" in nb.text
    assert "x_host in host memory: True | x_remote in host memory: False" in nb.text
    assert "same values: True" in nb.text
    assert "remote buffer: 1048576 bytes, host-readable: False" in nb.text
    if WIRED:
        html = "\n".join(nb.data("text/html"))
        assert "buffer types" in html and "CPU_REPACK" in html and "free of" in html
        assert "1.0 MiB" in html                                      # the buffers
        assert "x_remote" in html and "fetched from the device" in html


@pytest.mark.slow
@rpc_names
def test_03_events_and_timeline(monkeypatch):
    pytest.importorskip("matplotlib")
    nb = run("03-events-async.ipynb", monkeypatch)
    assert "copy equals tanh(X @ X): True" in nb.text
    assert "CPU: device CPU has no events" in nb.text
    for mode in ("one after another", "pipelined"):
        assert nb.number(rf"{mode}\s+\d+ ms, worst NMSE against numpy ([\d.e+-]+)") < 1e-6
    assert "each stage after the one before: True" in nb.text
    assert "bars per lane: {'RPC0': 4, 'RPC1': 4, 'CPU': 4}" in nb.text
    assert len(nb.data("image/png")) == 1                             # the timeline


@pytest.mark.slow
@rpc_names
def test_04_scheduler_split(monkeypatch):
    nb = run("04-scheduler.ipynb", monkeypatch)
    assert nb.number(r"splits (\d+), tensors copied between backends \d+, NMSE against") == 3
    assert nb.number(r"splits \d+, tensors copied between backends (\d+), NMSE against") >= 2
    assert nb.number(r"NMSE against numpy ([\d.e+-]+)") < 1e-10
    assert re.search(r"RPC0\s+6 ops", nb.text) and re.search(r"RPC1\s+3 ops", nb.text)
    assert re.search(r"CPU\s+4 ops: ADD MUL_MAT RELU SOFT_MAX", nb.text)
    assert nb.number(r"softmax on RPC1: splits (\d+)") == 4
    if WIRED:
        pictures = [h for h in nb.data("text/html") if "Scheduler" in h]
        assert len(pictures) == 2
        for html, splits in zip(pictures, (3, 4)):
            assert f"{splits} splits" in html and "<svg" in html and "copy of" in html
            assert "tensors copied between backends" in html
            table = html[html.index(">splits<"):html.index("<svg")]
            assert table.count("<tr>") == splits + 1                  # header + one row each
        (picture,) = nb.data("image/svg+xml")                        # the graph on its own
        assert ">RPC1<" in picture and "copy of" in picture


@pytest.mark.slow
@rpc_names
def test_05_gguf(monkeypatch):
    pytest.importorskip("ggml_py.gguf")
    nb = run("05-gguf.ipynb", monkeypatch)
    if "file: ggml-vocab-llama-spm.gguf" in nb.text:                  # the real file
        assert "tokens: 32000 arr[str] ['<unk>', '<s>', '</s>'" in nb.text
        assert "-> token ids [278, 6635, 3290, 373, 278, 1775]" in nb.text
    else:                                                              # no sdist in the cache
        assert "file: made-here-vocab.gguf" in nb.text
    assert re.search(r"token_embd.weight\s+q8_0\s+\(\d+, 32\)", nb.text)
    assert "host memory: True | on RPC0: False" in nb.text            # zero copy on the CPU
    for name in ("CPU", "RPC0"):
        assert nb.number(rf"{name}\s+NMSE against numpy ([\d.e+-]+)") < 1e-10
    assert nb.number(r"q8_0 table vs the float32 one: NMSE ([\d.e+-]+)") < 1e-3
    html = "\n".join(nb.data("text/html"))
    assert "tokenizer.ggml.tokens" in html and "token_embd.weight" in html


@pytest.mark.slow
def test_06_training(monkeypatch):
    pytest.importorskip("matplotlib")
    nb = run("06-training.ipynb", monkeypatch)
    assert nb.number(r"dW3 \(3, 64\): largest difference from the closed form ([\d.e+-]+)") < 1e-5
    assert nb.number(r"db3: ([\d.e+-]+)") < 1e-5
    first = nb.number(r"first epoch loss ([\d.]+)")
    last = nb.number(r"first epoch loss [\d.]+, last ([\d.]+)")
    accuracy = nb.number(r"accuracy on all points ([\d.]+)")
    assert last < first / 5 and accuracy > 0.95
    assert abs(nb.number(r"numpy accuracy with the trained parameters: ([\d.]+)") - accuracy) < 0.01
    assert len(nb.data("image/png")) == 1             # the loss curve and the decision regions


@pytest.mark.slow
@pytest.mark.skipif(gg.ggml_version() != "unknown" and tuple(
    int(x) for x in gg.ggml_version().split(".")[:2]) < (0, 26),
    reason="ggml_py offers meta devices from ggml 0.26.0")
def test_07_tensor_parallel(monkeypatch):
    nb = run("07-tensor-parallel.ipynb", monkeypatch)
    assert nb.number(r"MLP NMSE meta vs one device ([\d.e+-]+)") < 5e-4
    assert nb.number(r"attention NMSE meta vs one device ([\d.e+-]+)") < 5e-4
    assert "all-reduce: RPC comm" in nb.text
    assert "refused: meta device: MUL_MAT" in nb.text
    assert len(nb.data("image/png")) == 1                        # where each slice lives
    assert any("<code>[0:128, :]</code>" in h for h in nb.data("text/html"))
    graphs = [g for g in nb.data("image/svg+xml") + nb.data("text/html") if "<svg" in g]
    assert any('class="part0"' in g and 'class="part1"' in g and "mirrored (on each)" in g
               and ">partial sums<" in g for g in graphs)                 # the graph, by device
    assert "split states: [" in nb.text and "'PARTIAL'" in nb.text
    if "no CUDA pair here" not in nb.text:
        assert nb.number(r"CUDA MLP NMSE meta vs one device ([\d.e+-]+)") < 5e-4
