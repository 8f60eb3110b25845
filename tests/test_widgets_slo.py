"""SLOView: goodput and the knee of a stored sweep, recounted under the SLO the reader sets;
its picture carries the numbers, and its offline payload replays exactly what Python draws."""

import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("anywidget", reason="the widgets need the [book] extra (anywidget)")

from minillm.metrics import RequestMetrics, meets_slo  # noqa: E402
from widgets import SLOView, offline  # noqa: E402
from widgets.slo_view import SweepPoint, knee  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> str:
    root = ET.fromstring(svg)
    return "\n".join(el.text or "" for el in root.iter() if el.tag in (f"{SVG}text",
                                                                         f"{SVG}title"))


def request(ttft: float, tpot: float, n: int = 5) -> RequestMetrics:
    times = [ttft + i * tpot for i in range(n)]
    return RequestMetrics(arrival_time=0.0, first_scheduled_time=0.0, first_token_time=ttft,
                          finished_time=times[-1], token_times=times)


# Three rates of a toy sweep, each run 10 s: TTFT grows with load, TPOT too.
SWEEP = [SweepPoint.of(1.0, [request(0.1, 0.02)] * 10, 10.0),
         SweepPoint.of(2.0, [request(0.2, 0.03)] * 15 + [request(0.8, 0.03)] * 5, 10.0),
         SweepPoint.of(4.0, [request(0.3, 0.04)] * 10 + [request(3.0, 0.06)] * 20, 10.0)]


def test_goodput_counts_as_meets_slo_does() -> None:
    m = [request(0.2, 0.03), request(0.5, 0.03), request(0.5, 0.06), request(0.1, 0.02, n=1)]
    point = SweepPoint.of(3.0, m, 2.0)
    slo = {"ttft": 0.5, "tpot": 0.05}
    assert point.goodput(0.5, 0.05) == sum(meets_slo(x, slo) for x in m) / 2.0 == 1.5
    assert point.throughput == 2.0


def test_the_knee_moves_with_the_slo() -> None:
    assert knee(SWEEP, 1.0, 0.05) == (2.0, 2.0)  # 20 good of 20 at 2/s; 10 of 30 at 4/s
    assert knee(SWEEP, 5.0, 0.1) == (4.0, 3.0)  # a loose SLO: every request, highest rate
    assert knee(SWEEP, 0.15, 0.05) == (1.0, 1.0)  # a tight TTFT: only the lightest load
    assert knee(SWEEP, 0.05, 0.05)[1] == 0.0


def test_the_picture_shows_the_slo_the_knee_and_its_share() -> None:
    view = SLOView({"toy": SWEEP}, ttft_ms=1000, tpot_ms=50, source="a toy (modelled)")
    shown = texts(view.to_svg())
    assert "toy: goodput under TTFT ≤ 1,000 ms, TPOT ≤ 50 ms" in shown
    assert "knee: 2 req/s offered, goodput 2 req/s (100% of the finished requests" in shown
    assert "a toy (modelled)" in shown
    view.set_state({"ttft_ms": 5000, "tpot_ms": 100})
    assert "knee: 4 req/s offered, goodput 3 req/s" in texts(view.to_svg())
    view.set_state({"ttft_ms": 50})
    assert "no rate of the sweep meets this SLO" in texts(view.to_svg())


def test_state_validates() -> None:
    view = SLOView({"a": SWEEP, "b": SWEEP[:2]})
    assert view.get_state() == {"workload": "a", "ttft_ms": 1000, "tpot_ms": 50}
    view.set_state({"workload": "b"})
    assert view.points == SWEEP[:2]
    with pytest.raises(ValueError, match="unknown workload"):
        view.set_state({"workload": "c"})
    with pytest.raises(ValueError, match="positive int"):
        view.set_state({"ttft_ms": 0})
    with pytest.raises(ValueError, match="at least two rates"):
        SLOView({"a": SWEEP[:1]})


def test_offline_frames_are_pythons_pictures_of_every_slo() -> None:
    view = SLOView({"a": SWEEP, "b": SWEEP[1:]}, ttft_ms=700, tpot_ms=50)
    data, packed = offline.payload(view)
    names = [c["name"] for c in data["controls"]]
    assert names == ["workload", "ttft_ms", "tpot_ms"]
    ttft_values = data["controls"][1]["values"]
    assert 700 in ttft_values and ttft_values == sorted(ttft_values)
    sizes = [len(c["values"]) for c in data["controls"]]
    assert len(data["frames"]) == sizes[0] * sizes[1] * sizes[2]
    assert len(packed) <= offline.BUDGET
    last = data["frames"][-1]  # workload b, the loosest TTFT and TPOT stops
    view.set_state({"workload": "b", "ttft_ms": ttft_values[-1],
                    "tpot_ms": data["controls"][2]["values"][-1]})
    assert offline.decode(data["pieces"], last) == view.to_svg()
    html = view._repr_mimebundle_()["text/html"]
    assert html.startswith('<div class="minillm-view" data-view="SLOView">')
