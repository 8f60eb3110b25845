"""RooflineExplorer and KVCalculator: their SVG carries the calculators' numbers, reacts to the
controls, and shows itself in a notebook; no browser needed."""

import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("anywidget", reason="the widgets need the [book] extra (anywidget)")

from minillm.calc import roofline, sizing
from widgets import roofline as roofline_view  # noqa: E402
from widgets.kv_calculator import KVCalculator, kv_numbers  # noqa: E402
from widgets.roofline import RooflineExplorer, roofline_points  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> str:
    """All the text the picture shows (and its hover titles), joined by newlines."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return "\n".join(el.text or "" for el in root.iter() if el.tag in (f"{SVG}text",
                                                                         f"{SVG}title"))


@pytest.fixture
def fake_machine(monkeypatch: pytest.MonkeyPatch) -> roofline.Hardware:
    """'this machine' without the one-second microbenchmark."""
    hw = roofline.Hardware("this machine (cpu)", flops=2e11, bandwidth=2e10, memory=16e9)
    monkeypatch.setattr(roofline_view, "this_machine", lambda: hw)
    return hw


def test_roofline_svg_shows_ridge_bounds_and_times() -> None:
    view = RooflineExplorer("H100-SXM", "llama-3-8b", batch=8, prompt_len=1024, context_len=2048)
    shown = texts(view.to_svg())
    assert f"ridge {roofline.ridge_point('H100-SXM'):,.0f} FLOPs/B" == "ridge 295 FLOPs/B"
    assert "ridge 295 FLOPs/B" in shown
    pre = roofline.prefill_time("llama-3-8b", "H100-SXM", 1024)
    dec = roofline.decode_step_time("llama-3-8b", "H100-SXM", 8, 2048)
    assert pre.bound == "compute" and dec.bound == "memory"
    assert f"compute-bound, {roofline_view.fmt_seconds(pre.time)}" in shown
    assert f"memory-bound, {roofline_view.fmt_seconds(dec.time)}" in shown
    assert "14.7 ms" in shown  # the prefill time of roofline.prefill_time, as the chapter says
    assert "llama-3-8b on H100-SXM" in shown


def test_roofline_points_match_the_calculators() -> None:
    p = roofline_points("A100-80GB", "mistral-7b", batch=64, prompt_len=512, context_len=4096)
    assert p.ridge == roofline.ridge_point("A100-80GB")
    assert p.decode == roofline.decode_step_time("mistral-7b", "A100-80GB", 64, 4096)
    assert p.prefill == roofline.prefill_time("mistral-7b", "A100-80GB", 512)


def test_roofline_controls_change_the_picture() -> None:
    view = RooflineExplorer()
    before = view.to_svg()
    view.set_state({"batch": 512})
    after = view.to_svg()
    assert after != before and "decode, batch 512" in texts(after)
    view.set_state({"hardware": "L4", "model": "llama-3.2-1b"})
    assert "llama-3.2-1b on L4" in texts(view.to_svg())


def test_roofline_large_batch_decode_turns_compute_bound() -> None:
    view = RooflineExplorer("L4", "llama-3-8b", batch=1024, context_len=16)
    assert view.points().decode.bound == "compute"
    assert "decode: compute-bound" in texts(view.to_svg())


def test_roofline_this_machine_is_measured_on_demand(fake_machine: roofline.Hardware) -> None:
    view = RooflineExplorer(hardware="This Machine")
    assert view.hardware == "this machine"
    assert view.points().hardware is fake_machine
    assert "this machine (cpu)" in texts(view.to_svg())


def test_roofline_state_round_trips_and_validates() -> None:
    view = RooflineExplorer("H200", "qwen2.5-7b", batch=3, prompt_len=640, context_len=100)
    state = view.get_state()
    assert state == {"hardware": "H200", "model": "qwen2.5-7b", "batch": 3, "prompt_len": 640,
                     "context_len": 100, "dtype_bytes": 2}
    other = RooflineExplorer()
    other.set_state(state)
    assert other.get_state() == state and other.to_svg() == view.to_svg()
    assert eval(repr(view), {"RooflineExplorer": RooflineExplorer}).get_state() == state
    view.set_state({"batch": 16.0})  # a slider's number
    assert view.batch == 16 and isinstance(view.batch, int)
    for bad in ({"batch": 0}, {"batch": 2.5}, {"hardware": "Z80"}, {"model": "gpt-5"},
                {"dtype_bytes": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            view.set_state(bad)
    with pytest.raises(KeyError, match="colour"):
        view.set_state({"colour": "red"})


def test_kv_svg_shows_the_formula_with_numbers() -> None:
    view = KVCalculator("llama-3-8b", context_len=8192, batch=1, hardware="H100-SXM")
    shown = texts(view.to_svg())
    assert sizing.kv_bytes_per_token("llama-3-8b") == 131_072
    assert "2 · 32 · 8 · 128 · 2 = 131,072 bytes" in shown
    assert "2 · L · H_kv · D · S · B · bytes" in shown
    total = sizing.kv_cache_bytes("llama-3-8b", 8192)
    assert f"= 2 · 32 · 8 · 128 · 8,192 · 1 · 2 = {total:,} bytes (1.07 GB)" in shown
    wall = sizing.max_concurrency("llama-3-8b", "H100-SXM", 8192)
    assert f"at most {wall} sequences of 8,192 tokens" in shown and wall == 59
    assert "16.1 GB" in shown  # the weights


def test_kv_numbers_match_the_calculators() -> None:
    k = kv_numbers("qwen2.5-0.5b", context_len=32768, batch=4, dtype_bytes=1, hardware="L4")
    assert (k.layers, k.kv_heads, k.head_dim) == sizing.kv_dims("qwen2.5-0.5b")
    assert k.per_token == sizing.kv_bytes_per_token("qwen2.5-0.5b", 1)
    assert k.total == sizing.kv_cache_bytes("qwen2.5-0.5b", 32768, 4, 1)
    assert k.weights == sizing.weight_bytes("qwen2.5-0.5b", 1)
    assert k.max_sequences == sizing.max_concurrency("qwen2.5-0.5b", "L4", 32768, dtype_bytes=1)
    assert k.free == 24e9 - k.weights - k.total


def test_kv_bar_splits_memory_and_marks_overflow() -> None:
    fits = ET.fromstring(KVCalculator(batch=10).to_svg())
    kinds = {el.get("class") for el in fits.iter(f"{SVG}rect")}
    assert {"weights", "kv", "free"} <= kinds and "over" not in kinds
    over = KVCalculator(batch=100)
    shown = texts(over.to_svg())
    assert "does not fit" in shown and "over by" in shown
    assert "over" in {el.get("class") for el in ET.fromstring(over.to_svg()).iter(f"{SVG}rect")}
    assert "weights alone do not fit" in texts(KVCalculator("llama-3-70b", hardware="L4").to_svg())


def test_kv_controls_change_the_picture_and_state_round_trips() -> None:
    view = KVCalculator()
    before = view.to_svg()
    view.set_state({"context_len": 1024, "dtype_bytes": 1})
    assert view.to_svg() != before
    assert "2 · 32 · 8 · 128 · 1 = 65,536 bytes" in texts(view.to_svg())
    state = view.get_state()
    assert state == {"model": "llama-3-8b", "hardware": "H100-SXM", "context_len": 1024,
                     "batch": 1, "dtype_bytes": 1, "kv_dtype": "same as weights"}
    copy = KVCalculator()
    copy.set_state(state)
    assert copy.to_svg() == view.to_svg()
    with pytest.raises(ValueError, match="context_len"):
        view.set_state({"context_len": -5})


@pytest.mark.parametrize("make", [RooflineExplorer, KVCalculator])
def test_mimebundle_and_widget(make: type) -> None:
    view = make()
    bundle = view._repr_mimebundle_()
    assert f'<div class="mv-picture">{view.to_svg()}</div>' in bundle["text/html"]
    widget = view.widget()
    assert widget.svg == view.to_svg() and widget.values == view.get_state()
    names = {c["name"] for c in widget.controls}
    assert names == set(view.get_state())
    widget.values = {**widget.values, "batch": 32}  # what moving the batch slider does
    assert view.batch == 32 and widget.svg == view.to_svg()
    assert "<svg" in widget._repr_mimebundle_()[0]["text/html"]


def test_dropdowns_offer_every_hardware_and_model() -> None:
    controls = {c["name"]: c for c in RooflineExplorer().controls()}
    offered = [value for _, value in controls["hardware"]["options"]]
    assert offered == [*roofline.HARDWARE, "this machine"]
    assert [v for _, v in controls["model"]["options"]] == roofline_view.models.names()
    assert {c["kind"] for c in controls.values()} == {"select", "range"}
