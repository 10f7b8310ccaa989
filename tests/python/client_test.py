"""The Python client against a real coordinator, and the .rfd reader on files
written by `recfleet data synth`.

Run by client_test.sh beside it, which installs the package first; the binaries
come from the environment: RECFLEET_COORDINATOR_BIN, RECFLEET_CLI_BIN,
RECFLEET_MAKE_CERTS (deploy/tls/make-certs.sh) and RECFLEET_DEMO_SPEC (the
demo job file).
"""

import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import grpc
import numpy as np

import recfleet
from recfleet import rfd
from recfleet.v1 import job_service_pb2

TOKEN = "test-token-1234"


class Coordinator:
    """A recfleet-coordinator process on 127.0.0.1 (port 0) with a bearer
    token, in its own scratch folder; `args` are extra flags."""

    def __init__(self, args=()):
        self.dir = tempfile.mkdtemp(prefix="coord-", dir=os.environ.get("TEST_TMPDIR"))
        token_file = os.path.join(self.dir, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.log = open(os.path.join(self.dir, "coordinator.log"), "w+")
        self.proc = subprocess.Popen(
            [os.environ["RECFLEET_COORDINATOR_BIN"], "--listen=127.0.0.1:0",
             f"--db={self.dir}/jobs.db", "--metrics_address=127.0.0.1:0",
             f"--auth_token_file={token_file}", *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.address = self._wait_for_address()

    def _wait_for_address(self):
        deadline = time.time() + 20
        while time.time() < deadline:
            self.log.seek(0)
            m = re.search(r"recfleet coordinator serving on (\S+)", self.log.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.log.seek(0)
        raise RuntimeError(f"coordinator did not start:\n{self.log.read()}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class CoordinatorTest(unittest.TestCase):
    """Jobs through the client on a plain-text coordinator with a bearer
    token and no workers (so a submitted job waits QUEUED until cancelled)."""

    @classmethod
    def setUpClass(cls):
        cls.coordinator = Coordinator()
        cls.address = cls.coordinator.address
        cls.client = recfleet.connect(cls.address, token=TOKEN, timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.coordinator.stop()

    def test_submit_get_list_watch_cancel_the_demo_job(self):
        name = self.client.submit(os.environ["RECFLEET_DEMO_SPEC"])
        self.assertRegex(name, r"^jobs/\S+$")

        job = self.client.get(name)
        self.assertEqual(job.name, name)
        self.assertEqual(job.spec.display_name, "gemlite-example")
        # The YAML's lower-level fields and enums arrive as the CLI sends them.
        self.assertEqual(job.spec.data.local_batch_size, 128)
        self.assertEqual([t.name for t in job.spec.model.tables], ["item", "user", "item_category"])
        self.assertEqual(job.spec.model.sequence.attention.kind,
                         job.spec.model.sequence.attention.BLOCK)
        self.assertEqual(job.status.state, recfleet.JobState.QUEUED)

        self.assertIn(name, [j.name for j in self.client.list()])
        self.assertIn(name, [j.name for j in self.client.list(states=[recfleet.JobState.QUEUED])])
        self.assertNotIn(name, [j.name for j in self.client.list(
            states=[recfleet.JobState.RUNNING])])

        events = self.client.watch(name)
        first = next(events)
        self.assertEqual(first.kind, job_service_pb2.WatchJobResponse.SNAPSHOT)
        self.assertEqual(first.job.name, name)

        cancelled = self.client.cancel(name, reason="python client test")
        self.assertEqual(cancelled.status.state, recfleet.JobState.CANCELLED)
        rest = list(events)  # The stream ends by itself once the job has ended.
        self.assertTrue(rest, "no event after the cancel")
        self.assertEqual(rest[-1].job.status.state, recfleet.JobState.CANCELLED)
        self.assertIn(recfleet.JobState.CANCELLED,
                      [getattr(e.transition, "to") for e in rest
                       if e.kind == job_service_pb2.WatchJobResponse.STATE_CHANGE])
        self.assertEqual(self.client.wait(name).status.state, recfleet.JobState.CANCELLED)

        self.client.delete(name)
        with self.assertRaises(recfleet.RecfleetError) as e:
            self.client.get(name)
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_submit_a_dict_spec(self):
        spec = recfleet.load_job_spec(os.environ["RECFLEET_DEMO_SPEC"])
        from google.protobuf import json_format
        as_dict = json_format.MessageToDict(spec, preserving_proto_field_name=True)
        as_dict["display_name"] = "from-a-dict"
        name = self.client.submit(as_dict)
        self.assertEqual(self.client.get(name).spec.display_name, "from-a-dict")
        self.client.cancel(name)

    def test_an_invalid_spec_is_rejected_with_the_field_path(self):
        spec = recfleet.load_job_spec(os.environ["RECFLEET_DEMO_SPEC"])
        spec.model.tables[2].dim = 0
        with self.assertRaises(recfleet.RecfleetError) as e:
            self.client.submit(spec)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("tables[2].dim", e.exception.details)

    def test_an_unknown_field_is_a_value_error_before_any_call(self):
        with self.assertRaisesRegex(ValueError, "no_such_field"):
            self.client.submit({"display_name": "x", "no_such_field": 1})

    def test_errors_carry_the_grpc_status(self):
        with self.assertRaises(recfleet.RecfleetError) as e:
            self.client.get("jobs/does-not-exist")
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(e.exception.method, "GetJob")

        with recfleet.connect(self.address, token="") as anonymous:
            with self.assertRaises(recfleet.RecfleetError) as e:
                anonymous.list()
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)

        with recfleet.connect(self.address, token="wrong") as wrong:
            with self.assertRaises(recfleet.RecfleetError) as e:
                wrong.list()
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)

    def test_an_unreachable_coordinator_is_unavailable(self):
        with recfleet.connect("127.0.0.1:1", timeout=2) as nowhere:
            with self.assertRaises(recfleet.RecfleetError) as e:
                nowhere.get("jobs/x")
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)


class RfdReaderTest(unittest.TestCase):
    """Files from `recfleet data synth`, whose values follow rules the reader
    cannot satisfy by accident: every sample id once across the two splits,
    item_category = (item_id - 1) % clusters, every history exactly `fixed:7`
    long, ids inside their tables."""

    SAMPLES, USERS, ITEMS, CLUSTERS, LENGTH = 700, 40, 300, 8, 7

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="rfd-", dir=os.environ.get("TEST_TMPDIR"))
        subprocess.run(
            [os.environ["RECFLEET_CLI_BIN"], "data", "synth", "--out", cls.dir,
             "--samples", str(cls.SAMPLES), "--users", str(cls.USERS), "--items", str(cls.ITEMS),
             "--clusters", str(cls.CLUSTERS), "--dense", "2", "--lengths", f"fixed:{cls.LENGTH}",
             "--eval-fraction", "0.25", "--seed", "5", "--rows-per-block", "64"],
            check=True, stdout=subprocess.DEVNULL)
        cls.train = os.path.join(cls.dir, "train.rfd")
        cls.eval = os.path.join(cls.dir, "eval.rfd")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def info(self, path):
        """(rows, blocks, [(name, layout, dtype, table)]) as `recfleet data info` prints them."""
        out = subprocess.run([os.environ["RECFLEET_CLI_BIN"], "data", "info", "--dataset", path],
                             check=True, capture_output=True, text=True).stdout
        m = re.search(r": (\d+) rows in (\d+) blocks", out)
        features = [tuple(line.split("\t")) for line in out.splitlines()[1:]
                    if line and not line.startswith("#")]
        return int(m.group(1)), int(m.group(2)), features

    def test_schema_and_counts_match_the_cli(self):
        for path in (self.train, self.eval):
            rows, blocks, features = self.info(path)
            with rfd.open(path) as f:
                self.assertEqual(f.num_rows, rows)
                self.assertEqual(f.num_blocks, blocks)
                self.assertEqual(
                    [(x.name, "jagged" if x.jagged else "scalar", x.dtype.name,
                      x.table or "-") for x in f.features],
                    features)
                self.assertEqual(f.metadata["length_feature"], "history_items")
                self.assertEqual(f.metadata["table.item.rows"], str(self.ITEMS + 1))

    def test_values_follow_the_generator(self):
        train, ev = rfd.read(self.train), rfd.read(self.eval)
        ids = np.concatenate([train["sample_id"], ev["sample_id"]])
        self.assertEqual(sorted(ids.tolist()), list(range(self.SAMPLES)))
        self.assertGreater(len(ev["sample_id"]), 0)
        for cols in (train, ev):
            n = len(cols["sample_id"])
            self.assertTrue(np.all(np.diff(cols["sample_id"]) > 0))  # written in order
            self.assertEqual(cols["sample_id"].dtype, np.int64)
            self.assertEqual(cols["label"].dtype, np.float32)
            self.assertTrue(set(np.unique(cols["label"]).tolist()) <= {0.0, 1.0})
            np.testing.assert_array_equal(cols["item_category"],
                                          (cols["item_id"] - 1) % self.CLUSTERS)
            self.assertTrue(np.all((cols["user_id"] >= 1) & (cols["user_id"] <= self.USERS)))
            hist = cols["history_items"]
            self.assertEqual(len(hist), n)
            np.testing.assert_array_equal(hist.offsets, np.arange(n + 1) * self.LENGTH)
            self.assertEqual(len(hist.values), n * self.LENGTH)
            self.assertTrue(np.all((hist.values >= 1) & (hist.values <= self.ITEMS)))
            self.assertEqual(cols["dense_0"].dtype, np.float32)
            self.assertTrue(np.all(np.isfinite(cols["dense_0"])))
            # Dense features are standard normal draws: not all equal, not all zero.
            self.assertGreater(float(np.std(cols["dense_1"])), 0.5)

    def test_reading_by_block_and_by_column_agrees_with_reading_all(self):
        whole = rfd.read(self.train)
        with rfd.open(self.train) as f:
            self.assertGreater(f.num_blocks, 2)
            blocks = list(f.blocks(columns=["sample_id", "history_items"]))
            self.assertEqual(set(blocks[0]), {"sample_id", "history_items"})
            np.testing.assert_array_equal(np.concatenate([b["sample_id"] for b in blocks]),
                                          whole["sample_id"])
            np.testing.assert_array_equal(
                np.concatenate([b["history_items"].values for b in blocks]),
                whole["history_items"].values)
            r = 100  # in the second block
            np.testing.assert_array_equal(whole["history_items"].row(r),
                                          whole["history_items"].values[r * 7:(r + 1) * 7])
        with self.assertRaisesRegex(KeyError, "no_such_column"):
            rfd.read(self.train, columns=["no_such_column"])

    def copy(self, name):
        path = os.path.join(self.dir, name)
        shutil.copy(self.train, path)
        return path

    def test_a_corrupt_payload_byte_is_reported_with_block_and_offset(self):
        path = self.copy("corrupt.rfd")
        with rfd.open(path) as f:
            offset = f._blocks[1][0] + 24 + 10  # inside block 1's payload
        with open(path, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x40]))
        with rfd.open(path) as f:
            f.read_block(0)  # the other blocks are intact
            with self.assertRaisesRegex(rfd.RfdError,
                                        r"corrupt\.rfd: block 1 at byte offset \d+: payload "
                                        r"checksum mismatch"):
                f.read()

    def test_a_truncated_file_is_rejected(self):
        path = self.copy("truncated.rfd")
        size = os.path.getsize(path)
        for cut in (0, 7, 40, size // 2, size - 1):
            with open(path, "r+b") as f:
                f.truncate(cut)
            with self.assertRaises(rfd.RfdError, msg=f"cut at {cut}"):
                rfd.read(path)
            shutil.copy(self.train, path)

    def test_an_unknown_format_version_names_it(self):
        path = self.copy("v2.rfd")
        with open(path, "r+b") as f:
            f.seek(7)
            f.write(b"\x02")
        with self.assertRaisesRegex(rfd.UnsupportedVersionError,
                                    r"v2\.rfd: \.rfd format version 2; this reader implements "
                                    r"version 1 only"):
            rfd.open(path)

    def test_not_a_dataset(self):
        path = os.path.join(self.dir, "text.rfd")
        with open(path, "w") as f:
            f.write("hello, this is not a dataset file at all\n")
        with self.assertRaisesRegex(rfd.RfdError, "not a recfleet dataset file"):
            rfd.open(path)


class TlsTest(unittest.TestCase):
    """A coordinator serving mutual TLS with deploy/tls/make-certs.sh's test
    certificates: the client's TLS options reach it, and only with them."""

    @classmethod
    def setUpClass(cls):
        cls.certs = tempfile.mkdtemp(prefix="tls-", dir=os.environ.get("TEST_TMPDIR"))
        subprocess.run([os.environ["RECFLEET_MAKE_CERTS"], cls.certs], check=True,
                       stdout=subprocess.DEVNULL)
        cls.ca = os.path.join(cls.certs, "ca.pem")
        cls.coordinator = Coordinator([f"--tls_cert={cls.certs}/server.pem",
                                       f"--tls_key={cls.certs}/server.key",
                                       f"--tls_client_ca={cls.ca}"])

    @classmethod
    def tearDownClass(cls):
        cls.coordinator.stop()
        shutil.rmtree(cls.certs, ignore_errors=True)

    def test_mutual_tls_with_a_client_certificate(self):
        with recfleet.connect(self.coordinator.address, token=TOKEN, tls_ca=self.ca,
                              tls_cert=f"{self.certs}/client.pem",
                              tls_key=f"{self.certs}/client.key", timeout=10) as client:
            name = client.submit(os.environ["RECFLEET_DEMO_SPEC"])
            self.assertEqual(client.get(name).status.state, recfleet.JobState.QUEUED)
            client.cancel(name)

    def test_without_a_client_certificate_or_tls_the_call_fails(self):
        for kwargs in ({"tls_ca": self.ca}, {}):
            with recfleet.connect(self.coordinator.address, token=TOKEN, timeout=5,
                                  **kwargs) as client:
                with self.assertRaises(recfleet.RecfleetError, msg=str(kwargs)) as e:
                    client.list()
            self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_half_a_client_certificate_is_a_usage_error(self):
        with self.assertRaisesRegex(ValueError, "tls_cert and tls_key must be given together"):
            recfleet.connect(self.coordinator.address, tls_ca=self.ca,
                             tls_cert=f"{self.certs}/client.pem")


if __name__ == "__main__":
    unittest.main()
