# SPDX-License-Identifier: Apache-2.0
"""``python -m rmm_fences``: the ``rmm-fences`` command line (rmm_fences._cli)."""

import sys

from rmm_fences._cli import main

if __name__ == "__main__":
    sys.exit(main())
