"""For developers: test infrastructure (multi-node tests on one host).

Run ``msrun`` as it behaves on a machine that is NOT the master host.

msrun starts the scheduler when ``--master_addr`` is one of this machine's addresses. Two
"nodes" on one host both see 127.0.0.1 as theirs, so the second would also try to start a
scheduler on the taken port and exit non-zero. On a real second machine the master address
is remote; this launcher makes msrun see it that way and changes nothing else.
Usage: python tools/dev/msrun_other_host.py <msrun arguments> (``tools/dev/launch.py``, ``run_msrun_nodes``,
starts every node but the first this way)
"""
import sys

from mindspore.parallel.cluster import run
from mindspore.parallel.cluster.process_entity import _api

_api._is_local_ip = lambda address: False

if __name__ == "__main__":
    sys.argv[0] = "msrun"
    sys.exit(run.main())
