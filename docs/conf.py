"""Sphinx configuration for kvref's site. `scripts/docs` copies this next to nbdev's processed notebooks."""
import kvref

project = "kvref"
author = "kvref developers"
release = version = kvref.__version__
copyright = "2026, kvref developers"

extensions = [
    "myst_nb",                  # notebooks and MyST markdown
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",   # serves MathJax from _static: the site reads with no network
    "sphinx_copybutton",
]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]

# nbdev already executed every cell that the reader sees (`nbdev-proc-nbs`); Sphinx only renders.
nb_execution_mode = "off"
nb_merge_streams = True
nb_output_stderr = "remove"
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "attrs_inline", "strikethrough"]
myst_heading_anchors = 4
suppress_warnings = ["myst.header", "misc.highlighting_failure"]

html_theme = "furo"
html_title = f"kvref {release}"
html_static_path = ["_static"]
html_css_files = ["kvref.css"]
html_show_sourcelink = False
html_theme_options = {
    "sidebar_hide_name": False,
    "navigation_with_keys": True,
    "source_repository": "",
    "footer_icons": [],
}
html_permalinks_icon = "#"
pygments_style = "friendly"
pygments_dark_style = "monokai"
