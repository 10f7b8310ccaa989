"""A client for the coordinator's JobService (proto/recfleet/v1/job_service.proto).

It speaks like the `recfleet` CLI (cli/jobs/job_client.h): address from the
argument or $RECFLEET_COORDINATOR, bearer token from the argument or
$RECFLEET_AUTH_TOKEN (sent as "authorization: Bearer <token>"), TLS when a CA
is given (argument or $RECFLEET_TLS_CA), optionally with a client certificate
for mutual TLS, and a deadline on every unary call. CreateJob is retried on
UNAVAILABLE with the same request_id, so a retry never creates a second job.

Every failed call raises RecfleetError carrying the gRPC status code and the
server's message. A Client is safe to share between threads (gRPC channels
are); close() it, or use it as a context manager, when done.
"""

import os
import time
import uuid

import grpc

from recfleet.spec import load_job_spec
from recfleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc

JobState = job_pb2.JobStatus.State
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class RecfleetError(Exception):
    """A failed call: `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code, details, method=""):
        self.code = code
        self.details = details
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{code.name}: {details}")

    @classmethod
    def from_rpc_error(cls, error, method):
        return cls(error.code(), error.details(), method)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def connect(address=None, token=None, *, tls_ca=None, tls_cert=None, tls_key=None,
            tls_server_name=None, timeout=30.0):
    """Returns a Client for the coordinator at `address` ("host:port").

    address: default $RECFLEET_COORDINATOR.
    token: bearer token; default $RECFLEET_AUTH_TOKEN (none if unset).
    tls_ca: PEM file of the CA that signed the coordinator's certificate;
        default $RECFLEET_TLS_CA. Without one the channel is plain text, which
        the coordinator accepts only on a loopback address.
    tls_cert, tls_key: PEM files of a client certificate (mutual TLS).
    tls_server_name: the name to verify in the server's certificate when it
        differs from the host in `address`.
    timeout: seconds allowed for each unary call (watch has none).

    Connecting is lazy: an unreachable coordinator is reported by the first
    call, as RecfleetError with code UNAVAILABLE.
    """
    address = address or os.environ.get("RECFLEET_COORDINATOR", "")
    if not address or ":" not in address:
        raise ValueError(
            f"coordinator address must be host:port, got {address!r} "
            "(pass address= or set RECFLEET_COORDINATOR)")
    if token is None:
        token = os.environ.get("RECFLEET_AUTH_TOKEN", "")
    tls_ca = tls_ca or os.environ.get("RECFLEET_TLS_CA") or None
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key must be given together")
    if tls_cert is not None and tls_ca is None:
        raise ValueError("a client certificate needs tls_ca to verify the server")
    if tls_ca is None:
        channel = grpc.insecure_channel(address)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca),
            private_key=_read(tls_key) if tls_key else None,
            certificate_chain=_read(tls_cert) if tls_cert else None)
        options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
        channel = grpc.secure_channel(address, credentials, options=options)
    return Client(channel, token=token, timeout=timeout, address=address)


class Client:
    """JobService calls on one channel. Build it with connect()."""

    def __init__(self, channel, token="", timeout=30.0, address=""):
        self._channel = channel
        self._stub = job_service_pb2_grpc.JobServiceStub(channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self.address = address

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._channel.close()

    def _call(self, method, request, timeout=True):
        try:
            return getattr(self._stub, method)(
                request, metadata=self._metadata, timeout=self._timeout if timeout else None)
        except grpc.RpcError as e:
            raise RecfleetError.from_rpc_error(e, method) from None

    def submit(self, spec, request_id=None, retries=3, job_id=""):
        """Creates a job; returns its name ("jobs/<id>", "jobs/<job_id>" when
        job_id is given: 1-63 of [a-z0-9-], starting with a letter).

        spec: a JobSpec, a dict in the proto's field names, or the path of a
        YAML or JSON job file (see recfleet.spec.load_job_spec).
        """
        request = job_service_pb2.CreateJobRequest(
            spec=load_job_spec(spec), request_id=request_id or str(uuid.uuid4()),
            job_id=job_id)
        for attempt in range(retries + 1):
            try:
                return self._call("CreateJob", request).name
            except RecfleetError as e:
                if e.code != grpc.StatusCode.UNAVAILABLE or attempt == retries:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def get(self, name):
        """The job (recfleet.v1.Job): spec, state, progress, workers."""
        return self._call("GetJob", job_service_pb2.GetJobRequest(name=name))

    def list(self, states=(), page_size=0, labels=None, filter=""):
        """Every job, newest first, following pages; `states` filters by
        JobState values (e.g. [JobState.RUNNING]), `labels` ({key: value})
        and `filter` (the API's 'labels.KEY = "VALUE" AND ...') by labels."""
        terms = [filter] if filter.strip() else []
        for key, value in (labels or {}).items():
            quoted = str(value).replace("\\", "\\\\").replace('"', '\\"')
            terms.append(f'labels.{key} = "{quoted}"')
        jobs, token = [], ""
        while True:
            page = self._call("ListJobs", job_service_pb2.ListJobsRequest(
                page_size=page_size, page_token=token, states=list(states),
                filter=" AND ".join(terms)))
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    def cancel(self, name, reason=""):
        """Cancels a job that has not ended; returns it as it is then."""
        return self._call("CancelJob", job_service_pb2.CancelJobRequest(name=name, reason=reason))

    def delete(self, name):
        """Deletes a finished job and its history."""
        self._call("DeleteJob", job_service_pb2.DeleteJobRequest(name=name))

    def watch(self, name, include_progress=False):
        """Yields WatchJobResponse events (a SNAPSHOT first, then STATE_CHANGE
        and, with include_progress, PROGRESS) until the job ends; a stream
        that fails raises RecfleetError. Closing the generator cancels the
        stream."""
        stream = self._call("WatchJob", job_service_pb2.WatchJobRequest(
            name=name, include_progress=include_progress), timeout=False)
        try:
            for event in stream:
                yield event
        except grpc.RpcError as e:
            raise RecfleetError.from_rpc_error(e, "WatchJob") from None
        finally:
            stream.cancel()

    def wait(self, name, include_progress=False):
        """Follows watch() until the job ends; returns the final Job."""
        job = None
        for event in self.watch(name, include_progress=include_progress):
            job = event.job
        if job is None or job.status.state not in TERMINAL_STATES:
            job = self.get(name)
        return job
