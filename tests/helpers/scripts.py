# SPDX-License-Identifier: Apache-2.0
"""Scripts that are no package on ``sys.path`` (tools/), imported by the tests that check them."""

import importlib.util


def load_script(path, name=None):
    """The module of the script at ``path``, executed afresh under ``name`` (by default the
    file's stem); not entered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
