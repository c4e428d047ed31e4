"""A worker whose main is wrapped in torch's @record: the exception goes to TORCHELASTIC_ERROR_FILE."""

import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    """Fail at once."""
    raise ValueError(f"boom from rank {os.environ['RANK']}")


if __name__ == "__main__":
    main()
