"""docs/check_site.py's figure check, on a small hand-made page in headless Chromium: a figure whose text renders
below 11 CSS px at 1280 px (an inline SVG, or an SVG shown by an <img>, scaled down to its column) is named; a
legible one is not; and kvref.pictures' own drawings pass at the site's content width."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("playwright.sync_api")
spec = importlib.util.spec_from_file_location("check_site", ROOT / "docs" / "check_site.py")
check_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_site)
if not os.path.exists(check_site.CHROMIUM): pytest.skip(f"no Chromium at {check_site.CHROMIUM}", allow_module_level=True)

COLUMN = 736  # px: about Furo's article column at a 1280 px window (46em of 16 px)


def svg(width: int, font_px: float, words: str, height: int = 100) -> str:
    "An SVG document `width` user units wide whose one text is `font_px` units tall."
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}pt" height="{height}pt" viewBox="0 0 {width} {height}">'
            f'<text x="10" y="50" style="font-size: {font_px}px">{words}</text></svg>')


def page_html(body: str) -> str:
    return (f"<!doctype html><html><head><style>article {{ width: {COLUMN}px }} img, svg {{ max-width: 100%; height: auto }}"
            f"</style></head><body><article><h1>t</h1>{body}</article></body></html>")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=check_site.CHROMIUM, args=check_site.FLAGS)
        yield chromium
        chromium.close()


def problems_on(browser, tmp_path, files: dict[str, str]) -> list[str]:
    "Serve `files` from tmp_path (index.html among them) and run the figure check on index.html at 1280 px."
    for name, text in files.items(): (tmp_path / name).write_text(text)
    server, base = check_site.serve(tmp_path)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "index.html", wait_until="load")
        found = check_site.small_figure_text(page)
        page.close()
        return found
    finally:
        server.shutdown()


def test_a_wide_inline_svg_scaled_down_is_named(browser, tmp_path):
    "3000 units of drawing squeezed into 736 px: 12 px text shows at about 2 px; the 600-unit one stays legible."
    body = svg(3000, 12, "squeezed").replace("<svg ", '<svg id="wide" ') + svg(400, 12, "fine")
    found = problems_on(browser, tmp_path, {"index.html": page_html(body)})
    assert len(found) == 1 and "inline svg 1 #wide" in found[0] and "'squeezed'" in found[0], found


def test_an_svg_image_is_measured_at_the_size_it_is_shown(browser, tmp_path):
    "An <img> of a wide SVG file is laid out at the <img>'s size; a narrow one with 11 pt text passes."
    files = {"wide.svg": svg(2400, 11, "tiny"), "narrow.svg": svg(500, 11, "readable"),
             "index.html": page_html('<img src="wide.svg" alt="w"><img src="narrow.svg" alt="n">')}
    found = problems_on(browser, tmp_path, files)
    assert len(found) == 1 and "figure 1 (wide.svg)" in found[0] and "'tiny'" in found[0], found
    px = float(found[0].split(" renders text at ")[1].split(" px")[0])
    assert px == pytest.approx(11 * COLUMN / 2400, rel=0.05)  # the <img>'s scale, not the file's own


def matplotlib_svg(font_size: float) -> str:
    "A 9.5-inch matplotlib figure with its text drawn as glyph paths (matplotlib's default), at `font_size` pt."
    import io
    from matplotlib.figure import Figure
    fig = Figure(figsize=(9.5, 2))
    fig.text(0.1, 0.5, "glyphs", fontsize=font_size)
    buf = io.StringIO(); fig.savefig(buf, format="svg"); return buf.getvalue()


def test_text_drawn_as_glyph_paths_is_measured_too(browser, tmp_path):
    "Matplotlib's default 10 pt, in a 9.5-inch figure shown 736 px wide, is 10.8 px: named; 12 pt (12.9 px) passes."
    pytest.importorskip("matplotlib")
    files = {"ten.svg": matplotlib_svg(10), "twelve.svg": matplotlib_svg(12),
             "index.html": page_html('<img src="ten.svg"><img src="twelve.svg">')}
    found = problems_on(browser, tmp_path, files)
    assert len(found) == 1 and "figure 1 (ten.svg) renders text at 10.8 px" in found[0] and "'glyphs'" in found[0], found


def test_theme_icons_and_pages_without_figures_pass(browser, tmp_path):
    icon = '<svg viewBox="0 0 24 24" width="16"><path d="M0 0h24v24H0z"/></svg>'
    assert problems_on(browser, tmp_path, {"index.html": page_html(icon + "<p>no figures</p>")}) == []


def test_kvref_pictures_are_legible_at_the_sites_width(browser, tmp_path):
    "Block rows, a step and a chart, as a chapter shows them (an <img> in the article column): text at 11 px or more."
    from kvref.pictures import chart_svg, follow, rows_svg, step_svg
    from kvref.oracle.replay import load_decisions, load_trace
    golden = ROOT / "golden" / "traces"
    ops, decisions = load_trace(golden / "design-doc-example.jsonl"), load_decisions(golden / "design-doc-example.vllm.jsonl")
    files = {"rows.svg": rows_svg({"free queue": list(range(40))}, "forty blocks", cached=[3]),
             "step.svg": step_svg(list(follow(ops, decisions))[-1]),
             "chart.svg": chart_svg({"a": [1, 2, 3], "b": [3, 1, 2]}, x=["x", "y", "z"], kind="bars", marks={"m": 1}),
             "index.html": page_html("".join(f'<img src="{n}.svg">' for n in ("rows", "step", "chart")))}
    assert problems_on(browser, tmp_path, files) == []
