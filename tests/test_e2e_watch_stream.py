"""The e2e suite's `kubectl get --watch` reader (e2e/reliability/kit.py `json_values`), without a cluster.

kubectl lays a watch out two ways (v1.36.3, read off the dev cluster on 2026-12-03): `get --watch -o json`
pretty-prints each object over many lines (4-space indent, the closing brace at column 0), and
`--output-watch-events` writes each event compactly on one line. The reader used to wait for a line equal to "}",
so it parsed no event of the second layout and the cordon test's pod watch saw nothing (CI, stop 27).
"""

from __future__ import annotations

import json

from e2e.reliability.kit import json_values

POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "r1-move-decode-r0-0", "labels": {"meshplan.dev/serving-role": "decode"},
                    "annotations": {"note": "a } inside a string, and a {"}},
       "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def _stream(values, layout):
    if layout == "events":                       # --output-watch-events: one compact line per event
        return [json.dumps(v, separators=(",", ":")) + "\n" for v in values]
    return [line + "\n" for v in values for line in json.dumps(v, indent=4).split("\n")]


def test_each_value_is_read_in_either_layout_as_its_last_line_arrives():
    for layout, values in (("events", [{"type": t, "object": POD} for t in ("ADDED", "MODIFIED", "DELETED")]),
                           ("objects", [POD, {**POD, "metadata": {**POD["metadata"], "name": "other"}}])):
        lines, read, got = _stream(values, layout), [0], []

        def feed():
            for line in lines:
                read[0] += 1
                yield line

        for obj in json_values(feed()):
            got.append((obj, read[0]))
        assert [o for o, _ in got] == values, layout
        # streamed: each value comes out the moment its last line has been read, not at the end of the stream
        ends = [sum(len(_stream([v], layout)) for v in values[:i + 1]) for i in range(len(values))]
        assert [n for _, n in got] == ends, (layout, [n for _, n in got], ends)


def test_an_unfinished_value_is_not_yielded():
    lines = _stream([POD], "objects")[:-1]       # the closing brace never arrives (kubectl killed mid-object)
    assert list(json_values(lines)) == []
    assert list(json_values([_stream([POD], "events")[0][:-5] + "\n"])) == []
