"""A scheduler over tensors that already have memory (docs/validation.md, the scheduler class):
ggml cannot move placed memory, and aborts the process when no backend of the scheduler can
use a leaf's, a node's or a view source's buffer ("pre-allocated tensor ... in a buffer that
cannot run the operation"). ggml_py refuses such a graph first (``Scheduler._check``).

The generator places leaves (and sometimes the result) on the CPU and two RPC servers, and
schedules over random sets of backends, in a child process: before the rule, a case whose
memory no backend could use killed it (exit 134)."""
import subprocess
import sys
import textwrap

from support import child_env, needs_release

GENERATOR = r"""
import sys
import numpy as np
import ggml_py as gg

rng = np.random.default_rng(int(sys.argv[1]))
servers = [gg.rpc.serve(), gg.rpc.serve()]
devs = [gg.rpc.connect(s.endpoint).devices[0] for s in servers] + [gg.device("CPU")]
backs = [d.backend() for d in devs]          # RPC, RPC, CPU
computed = refused = 0
for case in range(int(sys.argv[2])):
    homes = [int(rng.integers(0, 3)) for _ in range(2)]
    node_home = int(rng.integers(0, 3)) if rng.random() < 0.3 else None
    view = rng.random() < 0.3
    members = [i for i in (0, 1) if rng.random() < 0.5] + [2]
    print(f"case {case}: leaves on {homes}, node on {node_home}, view {view}, "
          f"scheduler {members}", flush=True)
    xa, xb = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    ctxs = [gg.Context() for _ in range(2)]
    a, b = ctxs[0].tensor(gg.f32, (8,), "a"), ctxs[1].tensor(gg.f32, (8,), "b")
    if node_home is not None:            # the result gets memory where `a` is allocated
        homes[0] = node_home
        y = gg.relu(a * b)
    for c, h in zip(ctxs, homes):
        c.alloc(backs[h])
    a.set(xa)
    b.set(xb)
    if node_home is None:
        y = gg.relu((gg.view(a, (4,), 16) if view else a) * (gg.view(b, (4,), 16) if view else b))
    usable = set(members)
    expect_refusal = any(h not in usable for h in homes)
    with gg.Scheduler([backs[i] for i in members]) as sched:
        try:
            sched.compute(gg.Graph(y))
        except gg.InvalidArgument as e:
            assert expect_refusal, f"refused a usable graph: {e}"
            refused += 1
        else:
            assert not expect_refusal, "computed a graph whose memory no backend can use"
            ref = np.maximum(xa * xb, 0)
            np.testing.assert_allclose(y.numpy(), ref[4:8] if view and node_home is None
                                       else ref, rtol=1e-6)
            computed += 1
    for c in ctxs:
        c.close()
print(f"done: {computed} computed, {refused} refused", flush=True)
"""


@needs_release("0.23.0", "RPC servers that survive graphs split across two of them (0.15.3's "
                         "died at case 35 of this generator)")
def test_generated_placements_never_kill_the_process(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text(textwrap.dedent(GENERATOR))
    r = subprocess.run([sys.executable, str(script), "7", "80"], env=child_env(),
                       capture_output=True, text=True, timeout=300)
    last = (r.stdout.strip().splitlines() or ["(nothing)"])[-1]
    assert r.returncode == 0, f"the child died at {last}: {r.stderr[-800:]}"
    computed, refused = (int(w) for w in last.split()[1::2][:2])
    assert computed > 10 and refused > 10, last
