"""A script run with `torchrun --run-path /abs/path.py`: records __name__, sys.argv and its environment."""

import json
import os
import sys
from pathlib import Path

out = Path(os.environ["COMPAT_OUT"])
name = f"env_{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
(out / name).write_text(json.dumps({"env": dict(os.environ), "argv": sys.argv, "name": __name__}))
