"""The graph picture's layout (ggml_py._display_layout), on plain vertices: boxes of a row do
not overlap, every box lies inside the picture's margin, long edges pass through one
placeholder per row they cross, and edges entering one box enter at distinct spots."""
import itertools

from ggml_py import _display_layout as L


def _lay(n_nodes, n_all, edges, widths=None):
    layer = L.layers(n_nodes, n_all, edges, {})
    width = {v: float((widths or {}).get(v, 92)) for v in range(n_all)}
    return L.place(n_nodes, n_all, edges, layer, width, box_h=46, row_gap=36, margin=14, top=14)


# nodes 0..3 in dependency order, leafs 4..6: 0 = f(4, 5), 1 = g(0, 6), 2 = h(1, 4), 3 = k(2, 0)
EDGES = [(4, 0), (5, 0), (0, 1), (6, 1), (1, 2), (4, 2), (2, 3), (0, 3)]


def test_rows_follow_dependencies_and_long_edges_pass_placeholders():
    lay = _lay(4, 7, EDGES)
    for s, d in EDGES:
        assert lay.layer[s] < lay.layer[d]
    for chain in lay.chains:
        rows = [lay.layer[v] for v in chain]
        assert rows == list(range(rows[0], rows[-1] + 1))      # one vertex per row crossed
        assert all(v >= 7 for v in chain[1:-1])                 # placeholders, not boxes


def test_boxes_stay_apart_and_inside_the_margin():
    lay = _lay(4, 7, EDGES, widths={0: 200, 4: 150})
    for v in lay.x:
        assert lay.x[v] - lay.width[v] / 2 >= 14 - 1e-9
    by_row = {}
    for v in lay.x:
        by_row.setdefault(lay.layer[v], []).append(v)
    for row in by_row.values():
        for a, b in itertools.combinations(row, 2):
            assert abs(lay.x[a] - lay.x[b]) >= (lay.width[a] + lay.width[b]) / 2 - 1e-6


def test_edges_into_one_box_enter_at_distinct_spots():
    lay = _lay(4, 7, EDGES)
    entry = L.entries(lay)
    for d in {c[-1] for c in lay.chains}:
        spots = [entry[id(c)] for c in lay.chains if c[-1] == d]
        assert len(set(spots)) == len(spots)
        assert all(abs(s - lay.x[d]) < lay.width[d] / 2 for s in spots)
