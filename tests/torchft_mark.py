"""The one "is TorchFT installed" of the suite: its package importable and its lighthouse program beside this
interpreter (a virtualenv's bin/). Every TorchFT or lighthouse test is marked `needs_torchft`; where only a part of a
test needs it, `HAS_TORCHFT` says so.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ci_skips import needs

LIGHTHOUSE = Path(sys.executable).parent / "torchft_lighthouse"
HAS_TORCHFT = importlib.util.find_spec("torchft") is not None and os.access(LIGHTHOUSE, os.X_OK)
WHY_NOT = "torchft is not installed (pip install -c constraints.txt -e '.[ft]'): its Manager and torchft_lighthouse"
needs_torchft = needs(None if HAS_TORCHFT else WHY_NOT)
