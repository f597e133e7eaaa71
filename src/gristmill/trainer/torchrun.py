"""torchrun (`torch.distributed.run`) as `pipeline train` starts it, with failures told in one line.

torchrun answers a rank that exits non-zero with an error log line per rank, its own Python
traceback and a summary block (~30 lines) on top of what the rank printed. The ranks already
print one line for every error a user can fix (train.main), so here a failed rank's exit code is
passed on and torchrun's report is left out; a rank killed by a signal (the OOM killer) gets one
line, since it could print nothing itself. Used as `python -m gristmill.trainer.torchrun ARGS`,
with torchrun's arguments.
"""

from __future__ import annotations

import logging
import signal
import sys


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # "failed (exitcode: 2) local_rank: 0 ..." and "Sending process … closing signal": said better below
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode >= 0:
            return failure.exitcode
        name = _signal_name(-failure.exitcode)
        hint = " (out of memory? see `dmesg`)" if name == "SIGKILL" else ""
        print(
            f"error: training rank {rank} (pid {failure.pid}) was killed by {name}{hint}", file=sys.stderr, flush=True
        )
        return 128 - failure.exitcode
    except SignalException as e:  # this launcher was told to stop; torchrun has stopped the ranks
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
