"""Reads recfleet training checkpoints into numpy and exports them to .safetensors.

    ckpt = recfleet.checkpoint.load("/ckpt/job-1")          # newest complete step
    ckpt.dense["dcn.0.w"]                                     # float32, flat (numel,)
    ckpt.tables["item"]                                       # float32, (rows, dim)
    recfleet.checkpoint.export("/ckpt/job-1", "model.safetensors")

    python -m recfleet.checkpoint export CKPT OUT.safetensors [--step N] [--no-optimizer]
    python -m recfleet.checkpoint info CKPT

The format is the one worker/checkpoint.{h,cc} writes: a step directory
"step-<12 digits>" holding one shard file per rank ("shard-RRRRR-of-WWWWW",
magic "RFCKSH01", a record count, records of (u32 name length, name, u64 value
length, value), all little-endian, and a CRC-32C of everything before it) and a
MANIFEST written last (its header line, "step N", "world_size N" and
"shard RANK BYTES CRC" per rank). A step directory without MANIFEST, or whose
shards do not match it, is incomplete and is never read, as in the C++ reader.

The records (worker/single_rank_model.cc, worker/distributed_model.cc,
worker/rank_run.cc):
  fingerprint          "<param>:<numel>;" per dense parameter, in the order of
                       the flat dense vector, then "table.<name>:<rows>x<dim>;"
                       per embedding table, in table-index order
  adam_step, step, samples   decimal integers
  dense.range          "<first> <end>": a slice of the flat dense vector this
                       shard holds; "dense.<n>.range" for n >= 1 (with their
                       .value/.adam_m/.adam_v) more slices: the rank's part of
                       every FSDP unit, on either side of the experts, and its
                       own experts under expert parallelism
  dense.value, dense.adam_m, dense.adam_v   float32 over that slice
  table.<t>.rows       "<first> <end>": the rows of table t this shard holds
  table.<t>.cols       "<first> <end>": the columns, only for a column slice
  table.<t>.value      float32, the block, row-major
  table.<t>.adagrad    float32, one accumulator per row (of a column-wise
                       table only the first slice records it)
The reader assembles every tensor from whatever blocks the shards hold and
checks that they cover each element exactly once, so a checkpoint written
under any sharding plan reads back whole, or raises CheckpointError.

Dense parameters come back flat: the checkpoint records each parameter's
element count, not its shape.

Export writes the safetensors format (https://github.com/huggingface/safetensors)
through the `safetensors` package: parameters under their own names, embedding
tables as "table.<name>", and (unless with_optimizer=False) optimizer state as
"optimizer.adam_m.<param>", "optimizer.adam_v.<param>" and
"optimizer.adagrad.table.<name>"; step, adam_step, samples and the fingerprint
go into the file's string metadata.
"""

import argparse
import os
import re
import struct
import sys

import crc32c as _crc32c
import numpy as np

_SHARD_MAGIC = b"RFCKSH01"
_MANIFEST_HEADER = "recfleet-checkpoint 1"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(Exception):
    """A checkpoint that is missing, incomplete or damaged; the message names
    the file (and byte offset or record) at fault."""


def step_dir(directory, step):
    """"<directory>/step-<step, 12 digits>", as CheckpointStepDir."""
    return os.path.join(directory, f"step-{step:012d}")


def _shard_name(rank, world_size):
    return f"shard-{rank:05d}-of-{world_size:05d}"


def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from e


def decode_shard(data, path="<bytes>"):
    """The records {name: bytes} of one shard file's bytes, structure and
    CRC-32C checked."""

    def damaged(offset, what):
        return CheckpointError(f"checkpoint shard {path} is damaged at byte offset {offset}: {what}")

    if len(data) < len(_SHARD_MAGIC) + 8:
        raise damaged(0, "shorter than a header and trailer")
    if data[:len(_SHARD_MAGIC)] != _SHARD_MAGIC:
        raise damaged(0, "bad magic, expected RFCKSH01")
    body = len(data) - 4
    (stored,) = struct.unpack_from("<I", data, body)
    if _crc32c.crc32c(data[:body]) != stored:
        raise damaged(body, "CRC-32C mismatch")
    pos = len(_SHARD_MAGIC)
    (count,) = struct.unpack_from("<I", data, pos)
    pos += 4
    records = {}
    for _ in range(count):
        if pos + 4 > body:
            raise damaged(pos, "truncated record name")
        (name_len,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + name_len > body:
            raise damaged(pos, "truncated record name")
        name = data[pos:pos + name_len].decode("utf-8")
        pos += name_len
        if pos + 8 > body:
            raise damaged(pos, "truncated record value")
        (value_len,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        if value_len > body - pos:
            raise damaged(pos, "truncated record value")
        records[name] = data[pos:pos + value_len]
        pos += value_len
    if pos != body:
        raise damaged(pos, "trailing bytes after the last record")
    return records


def _manifest(directory):
    """(step, world_size, [(rank, bytes, crc)]) of a step directory's MANIFEST."""
    path = os.path.join(directory, "MANIFEST")
    if not os.path.exists(path):
        raise CheckpointError(f"{directory} has no MANIFEST (incomplete checkpoint)")
    lines = [l for l in _read_bytes(path).decode("utf-8", "replace").split("\n") if l]
    if not lines or lines[0] != _MANIFEST_HEADER:
        raise CheckpointError(f"checkpoint manifest {path}: expected '{_MANIFEST_HEADER}' first")
    step = world_size = None
    shards = []
    for line in lines[1:]:
        f = line.split(" ")
        try:
            if len(f) == 2 and f[0] == "step":
                step = int(f[1])
            elif len(f) == 2 and f[0] == "world_size":
                world_size = int(f[1])
            elif len(f) == 4 and f[0] == "shard":
                shards.append((int(f[1]), int(f[2]), int(f[3], 16)))
            else:
                raise ValueError(line)
        except ValueError:
            raise CheckpointError(f"checkpoint manifest {path}: unexpected line '{line}'") from None
    if not world_size or world_size <= 0 or len(shards) != world_size or step is None:
        raise CheckpointError(f"checkpoint manifest {path} lists {len(shards)} shards for "
                              f"world_size {world_size}")
    return step, world_size, shards


def read_step(directory):
    """(step, [records of rank 0, 1, ...]) of one complete step directory,
    every shard checked against the manifest (size and CRC-32C) and itself."""
    step, world_size, entries = _manifest(directory)
    shards = [None] * world_size
    for rank, size, crc in entries:
        if not 0 <= rank < world_size or shards[rank] is not None:
            raise CheckpointError(f"checkpoint manifest in {directory} lists rank {rank} twice or "
                                  f"outside [0, {world_size})")
        path = os.path.join(directory, _shard_name(rank, world_size))
        data = _read_bytes(path)
        if len(data) != size or _crc32c.crc32c(data) != crc:
            raise CheckpointError(f"checkpoint shard {path} does not match its MANIFEST: "
                                  f"{len(data)} bytes, manifest says {size}")
        shards[rank] = decode_shard(data, path)
    return step, shards


def complete_steps(directory):
    """Steps of the complete checkpoints under a checkpoint directory, newest first."""
    steps = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        m = _STEP_DIR.match(name)
        if not m:
            continue
        try:
            _manifest(os.path.join(directory, name))
        except CheckpointError:
            continue
        steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


class Checkpoint:
    """One assembled checkpoint. All arrays are float32.

    step, adam_step, samples: ints (samples of rank 0; None if not recorded)
    fingerprint: the model's fingerprint record
    dense, adam_m, adam_v: {parameter name: flat array}, in the model's order
    tables, adagrad: {table name: (rows, dim) array}, {table name: (rows,) array}
    """

    def __init__(self, step, adam_step, samples, fingerprint, dense, adam_m, adam_v, tables,
                 adagrad):
        self.step, self.adam_step, self.samples = step, adam_step, samples
        self.fingerprint = fingerprint
        self.dense, self.adam_m, self.adam_v = dense, adam_m, adam_v
        self.tables, self.adagrad = tables, adagrad

    def tensors(self, with_optimizer=True):
        """{name: array} under the export names (see the module docstring)."""
        out = dict(self.dense)
        out.update((f"table.{n}", v) for n, v in self.tables.items())
        if with_optimizer:
            out.update((f"optimizer.adam_m.{n}", v) for n, v in self.adam_m.items())
            out.update((f"optimizer.adam_v.{n}", v) for n, v in self.adam_v.items())
            out.update((f"optimizer.adagrad.table.{n}", v) for n, v in self.adagrad.items())
        return out

    def metadata(self):
        meta = {"format": "recfleet-checkpoint", "step": str(self.step),
                "adam_step": str(self.adam_step), "fingerprint": self.fingerprint}
        if self.samples is not None:
            meta["samples"] = str(self.samples)
        return meta


def parse_fingerprint(fingerprint):
    """([(dense name, numel)], [(table name, rows, dim)]) of a fingerprint record."""
    dense, tables = [], []
    for entry in fingerprint.split(";"):
        if not entry:
            continue
        name, _, size = entry.rpartition(":")
        m = re.fullmatch(r"(\d+)x(\d+)", size)
        if name.startswith("table.") and m:
            tables.append((name[len("table."):], int(m.group(1)), int(m.group(2))))
        elif re.fullmatch(r"\d+", size) and name and not tables:
            dense.append((name, int(size)))
        else:
            raise CheckpointError(f"checkpoint fingerprint entry '{entry}' is neither "
                                  "'<param>:<numel>' nor 'table.<name>:<rows>x<dim>'")
    return dense, tables


def _range(records, key, where):
    if key not in records:
        return None
    m = re.fullmatch(rb"(-?\d+) (-?\d+)", records[key])
    if not m or int(m.group(1)) > int(m.group(2)):
        raise CheckpointError(f"{where}: {key} is not a range '<first> <end>'")
    return int(m.group(1)), int(m.group(2))


def _floats(records, key, count, where):
    value = records.get(key)
    if value is None or len(value) != 4 * count:
        raise CheckpointError(f"{where}: {key} does not match its range ({count} floats)")
    return np.frombuffer(value, dtype="<f4")


class _Cover:
    """An array filled from blocks, each element exactly once."""

    def __init__(self, shape, what):
        self.array = np.zeros(shape, np.float32)
        self.count = np.zeros(shape, np.uint8)
        self.what = what

    def put(self, index, block):
        self.array[index] = block
        self.count[index] += 1

    def done(self):
        if not (self.count == 1).all():
            missing, twice = int((self.count == 0).sum()), int((self.count > 1).sum())
            raise CheckpointError(f"checkpoint records {self.what} incompletely: {missing} of "
                                  f"{self.count.size} elements missing, {twice} recorded twice")
        return self.array


# The range record of a shard's dense slice: "dense.range" or
# "dense.<n>.range" (worker/checkpoint.h DenseSlots).
_DENSE_RANGE = re.compile(r"^(dense(?:\.[1-9][0-9]*)?)\.range$")


def _dense_prefixes(shard):
    return sorted(m.group(1) for m in map(_DENSE_RANGE.match, shard) if m)


def assemble(step, shards):
    """A Checkpoint from the records of every rank (as read_step returns)."""
    fingerprints = {s.get("fingerprint") for s in shards}
    if len(fingerprints) != 1 or None in fingerprints:
        raise CheckpointError(f"checkpoint step {step}: the shards hold different models' "
                              "parameters (fingerprints differ or are missing)")
    fingerprint = fingerprints.pop().decode("utf-8")
    dense_spec, table_spec = parse_fingerprint(fingerprint)
    numel = sum(n for _, n in dense_spec)
    flat = {k: _Cover((numel,), f"dense.{k}") for k in ("value", "adam_m", "adam_v")}
    tables = [(_Cover((rows, dim), f"table {name}"), _Cover((rows,), f"table {name} accumulators"))
              for name, rows, dim in table_spec]
    for i, s in enumerate(shards):
        where = f"checkpoint step {step} shard {i}"
        for prefix in _dense_prefixes(s):
            r = _range(s, f"{prefix}.range", where)
            if r is None:
                continue
            if r[0] < 0 or r[1] > numel:
                raise CheckpointError(f"{where}: {prefix}.range {r} outside [0, {numel})")
            for k, cover in flat.items():
                cover.put(slice(*r), _floats(s, f"{prefix}.{k}", r[1] - r[0], where))
        for t, (_, rows, dim) in enumerate(table_spec):
            key = f"table.{t}"
            rr = _range(s, key + ".rows", where)
            if rr is None:
                continue
            cc = _range(s, key + ".cols", where) or (0, dim)
            if rr[0] < 0 or rr[1] > rows or cc[0] < 0 or cc[1] > dim:
                raise CheckpointError(f"{where}: {key} rows {rr} x cols {cc} outside {rows}x{dim}")
            n, width = rr[1] - rr[0], cc[1] - cc[0]
            block = _floats(s, key + ".value", n * width, where).reshape(n, width)
            tables[t][0].put((slice(*rr), slice(*cc)), block)
            if key + ".adagrad" in s:
                tables[t][1].put(slice(*rr), _floats(s, key + ".adagrad", n, where))

    def split(array):
        out, offset = {}, 0
        for name, n in dense_spec:
            out[name] = array[offset:offset + n]
            offset += n
        return out

    def integer(shard, key):
        try:
            return int(shard[key])
        except (KeyError, ValueError):
            return None

    adam_step = integer(shards[0], "adam_step")
    if adam_step is None:
        raise CheckpointError(f"checkpoint step {step} shard 0 has no optimizer step count")
    return Checkpoint(
        step=step, adam_step=adam_step, samples=integer(shards[0], "samples"),
        fingerprint=fingerprint,
        dense=split(flat["value"].done()), adam_m=split(flat["adam_m"].done()),
        adam_v=split(flat["adam_v"].done()),
        tables={name: v.done() for (name, _, _), (v, _) in zip(table_spec, tables)},
        adagrad={name: a.done() for (name, _, _), (_, a) in zip(table_spec, tables)})


def load(path, step=None):
    """The checkpoint at `path`: a checkpoint directory (its newest complete
    step, or `step`) or one step directory."""
    if os.path.exists(os.path.join(path, "MANIFEST")) or _STEP_DIR.match(os.path.basename(
            os.path.normpath(path))):
        return assemble(*read_step(path))
    if step is None:
        steps = complete_steps(path)
        if not steps:
            raise CheckpointError(f"no complete checkpoint under {path}")
        step = steps[0]
    return assemble(*read_step(step_dir(path, step)))


def export(path, out, step=None, with_optimizer=True):
    """Writes the checkpoint at `path` (as load takes it) to the .safetensors
    file `out`; returns the Checkpoint."""
    from safetensors.numpy import save_file

    ckpt = load(path, step)
    save_file({k: np.ascontiguousarray(v) for k, v in ckpt.tensors(with_optimizer).items()}, out,
              metadata=ckpt.metadata())
    return ckpt


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m recfleet.checkpoint",
                                description="Reads recfleet training checkpoints.")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write a checkpoint's tensors to a .safetensors file")
    e.add_argument("checkpoint", help="checkpoint directory (newest complete step) or step directory")
    e.add_argument("out", help="the .safetensors file to write")
    e.add_argument("--step", type=int, help="this step instead of the newest complete one")
    e.add_argument("--no-optimizer", action="store_true", help="parameters and tables only")
    i = sub.add_parser("info", help="list a checkpoint's tensors")
    i.add_argument("checkpoint")
    i.add_argument("--step", type=int)
    a = p.parse_args(argv)
    try:
        if a.command == "export":
            ckpt = export(a.checkpoint, a.out, a.step, not a.no_optimizer)
            print(f"wrote {len(ckpt.tensors(not a.no_optimizer))} tensors of step {ckpt.step} "
                  f"to {a.out}")
        else:
            ckpt = load(a.checkpoint, a.step)
            print(f"step {ckpt.step}  adam_step {ckpt.adam_step}  samples {ckpt.samples}")
            for name, v in ckpt.tensors().items():
                print(f"  {name:48s} {'x'.join(map(str, v.shape))}")
    except CheckpointError as err:
        print(f"recfleet.checkpoint: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
