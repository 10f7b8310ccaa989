"""The Python client against a real coordinator, and the .rfd reader on files
written by `recfleet data synth` and `data ingest` (format version 2, histories
inline and by reference) and on version-1 files.

Run by client_test.sh beside it, which installs the package first; the binaries
come from the environment: RECFLEET_COORDINATOR_BIN, RECFLEET_CLI_BIN,
RECFLEET_MAKE_CERTS (deploy/tls/make-certs.sh), RECFLEET_DEMO_SPEC (the
demo job file) and RECFLEET_RFD_V1 (a version-1 file of synthetic data).
"""

import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
import unittest

import crc32c
import grpc
import numpy as np

import recfleet
from recfleet import rfd
from recfleet.v1 import job_service_pb2

TOKEN = "test-token-1234"
WORKER_TOKEN = "test-worker-token-5678"


class Coordinator:
    """A recfleet-coordinator process on 127.0.0.1 (port 0) with a bearer
    token, in its own scratch folder; `args` are extra flags."""

    def __init__(self, args=()):
        self.dir = tempfile.mkdtemp(prefix="coord-", dir=os.environ.get("TEST_TMPDIR"))
        token_file = os.path.join(self.dir, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        # The coordinator takes both tokens or neither; no worker connects here.
        worker_token_file = os.path.join(self.dir, "worker-token")
        with open(worker_token_file, "w") as f:
            f.write(WORKER_TOKEN + "\n")
        self.log = open(os.path.join(self.dir, "coordinator.log"), "w+")
        self.proc = subprocess.Popen(
            [os.environ["RECFLEET_COORDINATOR_BIN"], "--listen=127.0.0.1:0",
             f"--db={self.dir}/jobs.db", "--metrics_address=127.0.0.1:0",
             f"--auth_token_file={token_file}", f"--worker_token_file={worker_token_file}",
             *args],
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

    def test_a_chosen_job_id_and_a_label_filter(self):
        spec = recfleet.load_job_spec(os.environ["RECFLEET_DEMO_SPEC"])
        spec.labels["suite"] = 'py "client"'
        name = self.client.submit(spec, job_id="py-chosen-id")
        self.assertEqual(name, "jobs/py-chosen-id")
        listed = [j.name for j in self.client.list(labels={"suite": 'py "client"'})]
        self.assertEqual(listed, ["jobs/py-chosen-id"])
        self.assertEqual(self.client.list(labels={"suite": "nobody"}), [])
        with self.assertRaises(recfleet.RecfleetError) as e:
            self.client.submit(spec, job_id="py-chosen-id")
        self.assertEqual(e.exception.code, grpc.StatusCode.ALREADY_EXISTS)
        with self.assertRaises(recfleet.RecfleetError) as e:
            self.client.list(filter="suite = x")
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
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


def cli(*args, check=True):
    return subprocess.run([os.environ["RECFLEET_CLI_BIN"], *args], check=check,
                          capture_output=True, text=True)


def info(path):
    """(rows, blocks, [(name, layout, dtype, table)]) as `recfleet data info` prints them."""
    out = cli("data", "info", "--dataset", path).stdout
    m = re.search(r": (\d+) rows in (\d+) blocks", out)
    features = [tuple(line.split("\t")) for line in out.splitlines()[1:]
                if line and not line.startswith("#")]
    return int(m.group(1)), int(m.group(2)), features


def verified_by_the_cli(path):
    """Whether the C++ reader accepts every block of `path`."""
    return cli("data", "info", "--dataset", path, "--verify", "yes", check=False).returncode == 0


def schema_of(f):
    return [(x.name, "jagged" if x.jagged else "scalar", x.dtype.name, x.table or "-")
            for x in f.features]


def write_rfd(path, version, f, blocks):
    """Writes the stored features of the open file `f` (schema and metadata)
    with the rows of `blocks` ({name: ndarray or rfd.Jagged}, one dict per
    block) as data/FORMAT.md describes, every array raw: files the C++
    writer does not make (version 1, a forged history reference)."""
    def u32(v):
        return struct.pack("<I", v)

    def text(fmt, s):
        b = s.encode()
        return struct.pack(fmt, len(b)) + b

    schema = u32(len(f.stored_features))
    for x in f.stored_features:
        schema += bytes([1 if x.dtype == np.int64 else 2, 2 if x.jagged else 1])
        schema += text("<H", x.name) + text("<H", x.table)
    schema += u32(len(f.metadata))
    for k in sorted(f.metadata):
        schema += text("<I", k) + text("<I", f.metadata[k])
    head = b"RFDSET\x00" + bytes([version]) + u32(len(schema)) + schema
    out = bytearray(head + u32(crc32c.crc32c(head if version >= 2 else head[8:])))
    coding = b"\x00" if version >= 2 else b""
    index = []
    for block in blocks:
        payload, rows = b"", 0
        for x in f.stored_features:
            col = block[x.name]
            if x.jagged:
                rows = len(col)
                payload += coding + col.offsets.astype("<u8").tobytes()
                col = col.values
            else:
                rows = len(col)
            payload += coding + col.astype(x.dtype).tobytes()
        header = struct.pack("<IIQI", 0x4B424652, rows, len(payload), crc32c.crc32c(payload))
        index.append((len(out), rows))
        out += header + u32(crc32c.crc32c(header)) + payload
    footer = struct.pack("<IIQ", 0x54464652, len(index), sum(r for _, r in index))
    footer += b"".join(struct.pack("<QI", o, r) for o, r in index)
    footer_offset = len(out)
    out += footer + u32(crc32c.crc32c(footer)) + struct.pack("<Q", footer_offset) + b"RFDSEND1"
    with open(path, "wb") as w:
        w.write(out)


def stored_blocks(f):
    """Every block of the open file `f` as stored (referenced features left out)."""
    return list(f.blocks(columns=[x.name for x in f.stored_features]))


def edit_payload(path, block, edit):
    """Applies `edit` (bytearray -> None, same length) to a block's payload
    and re-seals the block's checksums, so only the structure is wrong."""
    with rfd.open(path) as f:
        offset, size, _ = f._blocks[block]
    with open(path, "r+b") as w:
        w.seek(offset)
        data = bytearray(w.read(size))
        payload = data[24:]
        edit(payload)
        data[24:] = payload
        struct.pack_into("<I", data, 16, crc32c.crc32c(bytes(payload)))
        struct.pack_into("<I", data, 20, crc32c.crc32c(bytes(data[:20])))
        w.seek(offset)
        w.write(data)


def set_byte(path, offset, value):
    with open(path, "r+b") as w:
        w.seek(offset)
        w.write(bytes([value]))


class RfdTestCase(unittest.TestCase):
    def assertSameColumns(self, a, b):
        self.assertEqual(list(a), list(b))
        for name in a:
            x, y = a[name], b[name]
            if isinstance(x, rfd.Jagged):
                np.testing.assert_array_equal(x.offsets, y.offsets, err_msg=name)
                x, y = x.values, y.values
            self.assertEqual(x.dtype, y.dtype, name)
            np.testing.assert_array_equal(x, y, err_msg=name)


class RfdReaderTest(RfdTestCase):
    """Files from `recfleet data synth` (format version 2, histories inline),
    whose values follow rules the reader cannot satisfy by accident: every
    sample id once across the two splits, item_category = (item_id - 1) %
    clusters, every history exactly `fixed:7` long, ids inside their tables."""

    SAMPLES, USERS, ITEMS, CLUSTERS, LENGTH = 700, 40, 300, 8, 7

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="rfd-", dir=os.environ.get("TEST_TMPDIR"))
        cli("data", "synth", "--out", cls.dir,
            "--samples", str(cls.SAMPLES), "--users", str(cls.USERS), "--items", str(cls.ITEMS),
            "--clusters", str(cls.CLUSTERS), "--dense", "2", "--lengths", f"fixed:{cls.LENGTH}",
            "--eval-fraction", "0.25", "--seed", "5", "--rows-per-block", "64")
        cls.train = os.path.join(cls.dir, "train.rfd")
        cls.eval = os.path.join(cls.dir, "eval.rfd")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_schema_and_counts_match_the_cli(self):
        for path in (self.train, self.eval):
            rows, blocks, features = info(path)
            with rfd.open(path) as f:
                self.assertEqual(f.version, 2)
                self.assertEqual(f.num_rows, rows)
                self.assertEqual(f.num_blocks, blocks)
                self.assertEqual(schema_of(f), features)
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

    def test_the_writer_delta_codes_ids_and_offsets(self):
        # Otherwise the tests above would not exercise the decoder.
        with rfd.open(self.train) as f:
            offset = f._blocks[0][0]
        with open(self.train, "rb") as r:
            r.seek(offset + 24)
            self.assertEqual(r.read(1), b"\x01", "sample_id of block 0 is not delta+varint")

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

    def test_version_1_and_raw_version_2_copies_read_the_same(self):
        whole = rfd.read(self.train)
        with rfd.open(self.train) as f:
            blocks = stored_blocks(f)
            for version in (1, 2):
                path = os.path.join(self.dir, f"rewritten-v{version}.rfd")
                write_rfd(path, version, f, blocks)
                self.assertTrue(verified_by_the_cli(path), path)
                with rfd.open(path) as copy:
                    self.assertEqual(copy.version, version)
                    self.assertEqual(copy.num_blocks, f.num_blocks)
                    self.assertSameColumns(copy.read(), whole)

    def test_a_version_1_file(self):
        path = os.environ["RECFLEET_RFD_V1"]
        rows, blocks, features = info(path)
        with rfd.open(path) as f:
            self.assertEqual(f.version, 1)
            self.assertEqual((f.num_rows, f.num_blocks, schema_of(f)), (rows, blocks, features))
            cols = f.read()
        self.assertEqual(len(cols["sample_id"]), rows)
        self.assertTrue(np.all(np.diff(cols["sample_id"]) > 0))
        hist = cols["history_items"]
        self.assertEqual(len(hist), rows)
        self.assertEqual(hist.offsets[-1], len(hist.values))
        self.assertTrue(np.all(hist.values >= 1))
        self.assertTrue(set(np.unique(cols["label"]).tolist()) <= {0.0, 1.0})

    def copy(self, name, source=None):
        path = os.path.join(self.dir, name)
        shutil.copy(source or self.train, path)
        return path

    def test_a_corrupt_payload_byte_is_reported_with_block_and_offset(self):
        path = self.copy("corrupt.rfd")
        with rfd.open(path) as f:
            offset = f._blocks[1][0] + 24 + 10  # inside block 1's payload
        with open(path, "rb") as f:
            f.seek(offset)
            b = f.read(1)[0]
        set_byte(path, offset, b ^ 0x40)
        with rfd.open(path) as f:
            f.read_block(0)  # the other blocks are intact
            with self.assertRaisesRegex(rfd.RfdError,
                                        r"corrupt\.rfd: block 1 at byte offset \d+: payload "
                                        r"checksum mismatch"):
                f.read()

    def test_bad_array_codings_are_rejected_even_with_matching_checksums(self):
        def unknown_coding(p):
            p[0] = 7

        def unterminated_varint(p):  # The last byte of sample_id's coded array.
            (n,) = struct.unpack_from("<Q", p, 1)
            p[8 + n] |= 0x80

        def count_exceeds_bytes(p):
            struct.pack_into("<Q", p, 1, 3)

        for edit, message in ((unknown_coding, "values: unknown coding 7"),
                              (unterminated_varint, "values: bad delta\\+varint coding"),
                              (count_exceeds_bytes, "values: 64 values cannot fit in 3 coded")):
            path = self.copy(f"{edit.__name__}.rfd")
            edit_payload(path, 0, edit)
            self.assertFalse(verified_by_the_cli(path), edit.__name__)
            with self.assertRaisesRegex(rfd.RfdError, r"block 0 at byte offset \d+: feature "
                                                      r"'sample_id': " + message):
                rfd.read(path)

    def test_the_version_byte_is_covered_by_the_header_checksum(self):
        v2_as_v1 = self.copy("v2-as-v1.rfd")
        set_byte(v2_as_v1, 7, 1)
        with rfd.open(self.train) as f:
            v1 = os.path.join(self.dir, "v1-as-v2.rfd")
            write_rfd(v1, 1, f, stored_blocks(f))
        set_byte(v1, 7, 2)
        for path in (v2_as_v1, v1):
            self.assertFalse(verified_by_the_cli(path), path)
            with self.assertRaisesRegex(rfd.RfdError, "file header \\(schema\\) checksum"):
                rfd.open(path)

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
        path = self.copy("v3.rfd")
        set_byte(path, 7, 3)
        with self.assertRaisesRegex(rfd.UnsupportedVersionError,
                                    r"v3\.rfd: \.rfd format version 3; this reader implements "
                                    r"versions 1, 2 .*re-ingest with this version"):
            rfd.open(path)

    def test_not_a_dataset(self):
        path = os.path.join(self.dir, "text.rfd")
        with open(path, "w") as f:
            f.write("hello, this is not a dataset file at all\n")
        with self.assertRaisesRegex(rfd.RfdError, "not a recfleet dataset file"):
            rfd.open(path)


def time_bucket(now, then):
    """data/FORMAT.md's time bucket, in plain integers."""
    return 0 if now <= then else min(63, ((now - then) // 3600 + 1).bit_length() - 1)


class IngestedReaderTest(RfdTestCase):
    """Files from `recfleet data ingest` (histories by reference into
    sequences.rfs): the rebuilt history features must be each sample's
    window of its user's events, as data/FORMAT.md defines them."""

    @classmethod
    def ingest(cls, name, users, seed):
        rng = np.random.default_rng(seed)
        events = os.path.join(cls.dir, f"{name}.csv")
        with open(events, "w") as w:
            w.write("user_id,item_id,timestamp,rating\n")
            for u in range(users):
                t = 1_600_000_000 + int(rng.integers(0, 10**6))
                for _ in range(int(rng.integers(2, 30))):
                    t += int(rng.integers(0, 400_000))  # up to ~4.6 days apart
                    w.write(f"u{u},i{int(rng.integers(0, 50))},{t},{int(rng.integers(1, 6))}\n")
        out = os.path.join(cls.dir, name)
        cli("data", "ingest", "--input", events, "--out", out, "--max-history", "12",
            "--negatives", "1", "--rows-per-block", "40", "--seed", str(seed))
        return out

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ingest-", dir=os.environ.get("TEST_TMPDIR"))
        cls.out = cls.ingest("a", users=25, seed=3)
        cls.other = cls.ingest("b", users=9, seed=4)
        cls.train = os.path.join(cls.out, "train.rfd")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_schema_and_counts_match_the_cli(self):
        for split in ("train", "eval"):
            path = os.path.join(self.out, f"{split}.rfd")
            rows, blocks, features = info(path)
            with rfd.open(path) as f:
                self.assertEqual(f.version, 2)
                self.assertEqual((f.num_rows, f.num_blocks, schema_of(f)),
                                 (rows, blocks, features))
                self.assertIn("history_seq", [x.name for x in f.stored_features])
                self.assertNotIn("history_items", [x.name for x in f.stored_features])
            self.assertEqual([x[0] for x in features[-3:]],
                             ["history_actions", "history_items", "history_time_buckets"])

    def test_histories_are_the_windows_of_the_sequence_file(self):
        seqs = rfd.read(os.path.join(self.out, "sequences.rfs"))
        checked = 0
        for split in ("train", "eval"):
            cols = rfd.read(os.path.join(self.out, f"{split}.rfd"))
            n = len(cols["sample_id"])
            self.assertGreater(n, 40)
            lengths = cols["history_len"]
            self.assertGreater(int(lengths.max()), 5)
            self.assertLessEqual(int(lengths.max()), 12)
            for name in ("history_items", "history_actions", "history_time_buckets"):
                self.assertEqual(cols[name].values.dtype, np.int64)
                np.testing.assert_array_equal(cols[name].lengths(), lengths, err_msg=name)
            buckets = set()
            for r in range(n):
                s, end, k = (int(cols[c][r]) for c in ("history_seq", "history_end",
                                                       "history_len"))
                window = slice(end - k, end)
                for name, column in (("history_items", "items"), ("history_actions", "actions")):
                    np.testing.assert_array_equal(cols[name].row(r), seqs[column].row(s)[window],
                                                  err_msg=f"{split} row {r} {name}")
                now = int(cols["timestamp"][r])
                expect = [time_bucket(now, int(t)) for t in seqs["times"].row(s)[window]]
                self.assertEqual(cols["history_time_buckets"].row(r).tolist(), expect)
                buckets.update(expect)
                checked += 1
            self.assertGreater(len(buckets), 3, "time buckets too uniform to test anything")
        self.assertGreater(checked, 100)

    def test_version_1_copy_with_references_reads_the_same(self):
        with rfd.open(self.train) as f:
            path = os.path.join(self.out, "train-v1.rfd")
            write_rfd(path, 1, f, stored_blocks(f))
        self.assertTrue(verified_by_the_cli(path))
        self.assertSameColumns(rfd.read(path), rfd.read(self.train))

    def test_a_missing_sequence_file_says_to_re_ingest(self):
        alone = os.path.join(self.dir, "alone")
        os.makedirs(alone, exist_ok=True)
        shutil.copy(self.train, alone)
        with self.assertRaisesRegex(rfd.RfdError,
                                    r"train\.rfd: its histories are stored in sequences\.rfs next "
                                    r"to it, which is unusable \(.*cannot open.*\); keep the files "
                                    r"of one ingest together, or re-ingest"):
            rfd.open(os.path.join(alone, "train.rfd"))

    def test_a_sequence_file_of_another_ingest_says_to_re_ingest(self):
        mixed = os.path.join(self.dir, "mixed")
        os.makedirs(mixed, exist_ok=True)
        shutil.copy(self.train, mixed)
        shutil.copy(os.path.join(self.other, "sequences.rfs"), mixed)
        path = os.path.join(mixed, "train.rfd")
        self.assertFalse(verified_by_the_cli(path))
        with self.assertRaisesRegex(rfd.RfdError, r"sequences\.rfs: sequence id '\S+' is not "
                                                  r"the '\S+' its sample files expect: the files "
                                                  r"come from different ingests; re-ingest"):
            rfd.open(path)

    def test_a_sequence_file_naming_a_sequence_file_is_rejected(self):
        # sequences.rfs made to name itself: its rows hold references too.
        loop = os.path.join(self.dir, "loop")
        os.makedirs(loop, exist_ok=True)
        with rfd.open(self.train) as f:
            f.metadata.update({"sequence.file": "sequences.rfs", "sequence.id": "loop"})
            write_rfd(os.path.join(loop, "sequences.rfs"), 2, f, stored_blocks(f))
        shutil.copy(os.path.join(loop, "sequences.rfs"), os.path.join(loop, "train.rfd"))
        with self.assertRaisesRegex(rfd.RfdError, r"train\.rfd: its histories are stored in "
                                                  r"sequences\.rfs next to it, which is unusable "
                                                  r"\(.*named by a sequence file"):
            rfd.open(os.path.join(loop, "train.rfd"))

    def test_a_reference_outside_the_sequence_file_is_rejected(self):
        with rfd.open(os.path.join(self.out, "sequences.rfs")) as seqs:
            num_sequences = seqs.num_rows
        with rfd.open(self.train) as f:
            blocks = stored_blocks(f)
            row = {c: int(blocks[1][c][3]) for c in ("history_seq", "history_end", "history_len")}
            for column, value in (("history_end", 10**6), ("history_seq", num_sequences),
                                  ("history_seq", -1), ("history_len", -1),
                                  ("history_len", row["history_end"] + 1)):
                forged = [dict(b) for b in blocks]
                forged[1][column] = forged[1][column].copy()
                forged[1][column][3] = value
                path = os.path.join(self.out, "forged.rfd")
                write_rfd(path, 2, f, forged)
                self.assertFalse(verified_by_the_cli(path), (column, value))
                want = dict(row, **{column: value})
                with rfd.open(path) as copy:
                    copy.read_block(0)
                    with self.assertRaisesRegex(
                            rfd.RfdError,
                            rf"forged\.rfd: block 1 at byte offset \d+: row 3: history reference "
                            rf"\(sequence {want['history_seq']}, end {want['history_end']}, "
                            rf"length {want['history_len']}\) lies outside the sequence file"):
                        copy.read_block(1)


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
