"""Whether a stream is a terminal a person watches: the one question behind every live
display (the launcher's table, StepProgress bars, `paramshard stats`, rich tables).

``isatty()`` alone is not it. Open MPI gives every rank a pseudo-terminal for its
stdout even when mpirun's own output goes to a file (open-mpi/ompi#7868), so a rank
that trusted it filled the file with cursor moves and colour codes. A rank started by
an engine (mpirun, srun, a launcher over ssh) has its output forwarded by that engine:
it writes plain lines. ``TERM=dumb`` (editors' shells, some CI) asks for plain too.
"""
from __future__ import annotations

import os

# Set in every rank an engine starts; mpirun/mpiexec (Open MPI, MPICH/Hydra, PMIx) and srun.
# srun --pty gives a rank a real terminal, but its step output is still each rank's, interleaved.
ENGINE_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def is_live_terminal(stream, environ=None) -> bool:
    """True when ``stream`` is a terminal someone watches directly: live tables, bars and
    colours are welcome. False for files, pipes, ``TERM=dumb`` and any rank whose output an
    engine forwards (even through a pseudo-terminal): plain lines only."""
    environ = os.environ if environ is None else environ
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):       # no isatty, or a closed stream
        return False
    if not tty or environ.get("TERM", "") == "dumb":
        return False
    return not any(environ.get(name) for name in ENGINE_RANK_VARIABLES)
