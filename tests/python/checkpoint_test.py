"""The Python checkpoint reader (recfleet.checkpoint) and its .safetensors
export, on checkpoints the C++ side wrote: one from `recfleet train --local`
(a world of one) and a 3-rank one with row- and column-sharded tables and FSDP
dense ranges around expert-parallel slices (checkpoint_fixture write). Each is compared element for element
with what the worker's own restore code assembles from it (checkpoint_fixture
dump), then exported and read back through the safetensors package.

Run by client_test.sh beside it, which installs the package first; binaries
from the environment: RECFLEET_CLI_BIN, RECFLEET_DEMO_SPEC (the demo job file)
and RECFLEET_CHECKPOINT_FIXTURE.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

from recfleet import checkpoint

FIXTURE = os.environ.get("RECFLEET_CHECKPOINT_FIXTURE", "")


def cpp_dump(ckpt_dir, world_size):
    """What the C++ restore code assembles: {file stem: float32 array}, meta."""
    out = tempfile.mkdtemp(prefix="dump-", dir=os.environ.get("TEST_TMPDIR"))
    subprocess.run([FIXTURE, "dump", ckpt_dir, str(world_size), out], check=True)
    arrays = {f[:-4]: np.fromfile(os.path.join(out, f), dtype="<f4")
              for f in os.listdir(out) if f.endswith(".f32")}
    with open(os.path.join(out, "meta.txt")) as f:
        meta = dict(line.split() for line in f if line.strip())
    return arrays, meta


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-", dir=os.environ.get("TEST_TMPDIR"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def assert_matches_cpp(self, ckpt, ckpt_dir, world_size):
        arrays, meta = cpp_dump(ckpt_dir, world_size)
        self.assertEqual(ckpt.step, int(meta["step"]))
        self.assertEqual(ckpt.adam_step, int(meta["adam_step"]))
        for key, moments in (("value", ckpt.dense), ("adam_m", ckpt.adam_m),
                             ("adam_v", ckpt.adam_v)):
            np.testing.assert_array_equal(np.concatenate(list(moments.values())),
                                          arrays[f"dense.{key}"], err_msg=key)
        for name, table in ckpt.tables.items():
            np.testing.assert_array_equal(table.ravel(), arrays[f"table.{name}.value"], err_msg=name)
            np.testing.assert_array_equal(ckpt.adagrad[name], arrays[f"table.{name}.adagrad"],
                                          err_msg=name)
        self.assertEqual(len(arrays), 3 + 2 * len(ckpt.tables))

    def assert_round_trip(self, ckpt_dir):
        out = os.path.join(self.dir, "model.safetensors")
        ckpt = checkpoint.export(ckpt_dir, out)
        loaded = load_file(out)
        expected = ckpt.tensors()
        self.assertEqual(sorted(loaded), sorted(expected))
        for name, v in expected.items():
            self.assertEqual(loaded[name].dtype, np.float32, name)
            np.testing.assert_array_equal(loaded[name], v, err_msg=name)
        with safe_open(out, framework="numpy") as f:
            meta = f.metadata()
        self.assertEqual(meta["step"], str(ckpt.step))
        self.assertEqual(meta["fingerprint"], ckpt.fingerprint)
        # The CLI entry, parameters only.
        lean = os.path.join(self.dir, "lean.safetensors")
        subprocess.run([sys.executable, "-m", "recfleet.checkpoint", "export", ckpt_dir, lean,
                        "--no-optimizer"], check=True, capture_output=True)
        self.assertEqual(sorted(load_file(lean)), sorted(ckpt.tensors(with_optimizer=False)))
        self.assertFalse(any(k.startswith("optimizer.") for k in load_file(lean)))
        return ckpt


class TrainedCheckpointTest(Base):
    """A checkpoint of the demo GEM-lite model after a few CPU steps."""

    def test_reads_what_train_local_wrote_and_exports_it(self):
        ckpt_dir = os.path.join(self.dir, "train")
        dataset = ("synthetic://gemlite?samples=1500&users=60&items=60&clusters=4&dense=4"
                   "&lengths=lognormal:mean=6,sigma=0.5,min=1,max=16&eval_fraction=0.2&seed=3")
        run = subprocess.run(
            [os.environ["RECFLEET_CLI_BIN"], "train", "--local", os.environ["RECFLEET_DEMO_SPEC"],
             "--dataset", dataset, "--steps", "3", "--checkpoint-dir", ckpt_dir,
             "--data-root", self.dir],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        ckpt = checkpoint.load(ckpt_dir)
        self.assertEqual(ckpt.step, 3)
        self.assertEqual(ckpt.adam_step, 3)
        # The demo spec's tables (deploy/examples/job-gemlite.yaml).
        self.assertEqual({n: t.shape for n, t in ckpt.tables.items()},
                         {"item": (600, 32), "user": (600, 32), "item_category": (16, 32)})
        self.assertGreater(len(ckpt.dense), 5)
        # Trained: Adam's moments moved off zero and the sparse accumulators grew.
        self.assertTrue(any(np.abs(m).max() > 0 for m in ckpt.adam_m.values()))
        self.assertGreater(ckpt.adagrad["item"].max(), 0)
        self.assert_matches_cpp(ckpt, ckpt_dir, 1)
        self.assert_round_trip(ckpt_dir)


class ShardedCheckpointTest(Base):
    """A 3-rank checkpoint: dense in FSDP ranges on both sides of two
    expert-parallel slices ("dense.1" and "dense.2" records), table "item" by rows, table
    "user" by columns with the accumulators in the first slice only."""

    def setUp(self):
        super().setUp()
        self.ckpt_dir = os.path.join(self.dir, "sharded")
        subprocess.run([FIXTURE, "write", self.ckpt_dir], check=True)

    def test_assembles_tables_from_row_and_column_shards(self):
        ckpt = checkpoint.load(self.ckpt_dir)
        self.assertEqual((ckpt.step, ckpt.adam_step, ckpt.samples), (7, 11, 1408))
        # The fixture's formulas (checkpoint_fixture.cc), recomputed here.
        i = np.arange(9, dtype=np.float32)
        np.testing.assert_array_equal(ckpt.dense["mlp.w"], (0.5 * i - 1)[:6])
        np.testing.assert_array_equal(ckpt.dense["mlp.b"], (0.5 * i - 1)[6:])
        np.testing.assert_allclose(ckpt.adam_v["mlp.b"], 0.02 * (i[6:] + 1), rtol=1e-6)
        for t, (name, rows, dim) in enumerate((("item", 5, 4), ("user", 4, 6))):
            r, c = np.meshgrid(np.arange(rows), np.arange(dim), indexing="ij")
            np.testing.assert_array_equal(ckpt.tables[name], (100 * t + 10 * r + c + 0.25).astype(np.float32))
            np.testing.assert_array_equal(ckpt.adagrad[name], (t + 0.5 * np.arange(rows)).astype(np.float32))
        self.assert_matches_cpp(ckpt, self.ckpt_dir, 3)
        self.assert_round_trip(self.ckpt_dir)

    def test_refuses_damaged_incomplete_and_uncovered_checkpoints(self):
        step = checkpoint.step_dir(self.ckpt_dir, 7)
        shard = os.path.join(step, "shard-00001-of-00003")
        with open(shard, "rb") as f:
            data = bytearray(f.read())
        # A flipped byte: the manifest's CRC no longer matches.
        data[40] ^= 1
        with open(shard, "wb") as f:
            f.write(data)
        with self.assertRaisesRegex(checkpoint.CheckpointError, "does not match its MANIFEST"):
            checkpoint.load(step)
        # ... nor the shard's own CRC.
        with self.assertRaisesRegex(checkpoint.CheckpointError, "CRC-32C mismatch"):
            checkpoint.decode_shard(bytes(data), shard)
        # Without a MANIFEST the step is incomplete and never read.
        os.remove(os.path.join(step, "MANIFEST"))
        with self.assertRaisesRegex(checkpoint.CheckpointError, "no complete checkpoint"):
            checkpoint.load(self.ckpt_dir)
        # Shards that leave rows of a table out.
        data[40] ^= 1
        records = checkpoint.decode_shard(bytes(data), shard)
        records.pop("table.0.rows")
        shards = []
        for r in (0, 2):
            with open(os.path.join(step, f"shard-0000{r}-of-00003"), "rb") as f:
                shards.append(checkpoint.decode_shard(f.read()))
        with self.assertRaisesRegex(checkpoint.CheckpointError, "table item incompletely: 12 of 20"):
            checkpoint.assemble(7, [shards[0], records, shards[1]])

    def test_cli_exit_codes(self):
        run = subprocess.run([sys.executable, "-m", "recfleet.checkpoint", "info", self.dir],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("no complete checkpoint", run.stderr)
        run = subprocess.run([sys.executable, "-m", "recfleet.checkpoint", "info", self.ckpt_dir],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("table.user", run.stdout)
        self.assertIn("4x6", run.stdout)


if __name__ == "__main__":
    unittest.main()
