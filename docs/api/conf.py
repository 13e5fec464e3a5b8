"""Sphinx configuration for the API reference (``make docs``; output in build/docs/html, git-ignored).

Sphinx with autodoc and napoleon because the docstrings are Google style (``Args:``, ``Returns:``, ``Raises:``,
``Example::``) and Lightning's own reference is built the same way. The user guides stay Markdown in docs/, read on
GitHub; this site holds the reference only and links to them.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import lightning_hetero  # noqa: E402

project = "lightning-hetero"
author = "The lightning-hetero authors"
copyright = "The lightning-hetero authors"
release = lightning_hetero.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "check_args",
]

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
# Members are listed per class in the .rst files: the callbacks' and the strategy's Lightning hooks are not API, and a
# listed member that no longer exists is a warning (an error under -W), so a rename breaks the build.
autodoc_default_options = {"show-inheritance": False}

html_theme = "alabaster"
html_title = f"lightning-hetero {release}: API reference"
exclude_patterns = ["_build"]
