"""A script written for `python -m torch.distributed.launch`: the local rank comes as --local-rank (or the older
--local_rank). Writes $COMPAT_OUT/env_<rank>_<restart>.json with its environment and arguments. No torch needed."""

import argparse
import json
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", "--local_rank", type=int, default=-1)
parser.add_argument("--tag", default="")
args = parser.parse_args()
out = Path(os.environ["COMPAT_OUT"])
name = f"env_{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
(out / name).write_text(json.dumps({"env": dict(os.environ), "argv": sys.argv, "local_rank": args.local_rank,
                                    "tag": args.tag}))
print(f"local rank {args.local_rank} tag {args.tag}")
