"""recfleet's Python client: jobs on a coordinator, and .rfd datasets as numpy.

    import recfleet
    with recfleet.connect("127.0.0.1:7070") as client:
        name = client.submit("deploy/examples/job-gemlite.yaml")
        print(client.get(name).status.state)
    cols = recfleet.rfd.read("data/train.rfd")
"""

from recfleet import rfd
from recfleet.client import TERMINAL_STATES, Client, JobState, RecfleetError, connect
from recfleet.spec import load_job_spec

__all__ = ["Client", "JobState", "RecfleetError", "TERMINAL_STATES", "connect", "load_job_spec",
           "rfd"]
