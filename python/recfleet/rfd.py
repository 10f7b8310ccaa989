"""Reads recfleet dataset files (.rfd, data/FORMAT.md, versions 1 and 2) into numpy.

    ds = recfleet.rfd.open("train.rfd")      # header, footer and block index checked
    cols = ds.read()                          # {name: ndarray or Jagged}, every block checked
    cols["label"]                             # float32, one value per row
    hist = cols["history_items"]              # Jagged: hist.values, hist.offsets (num_rows + 1)
    hist.values[hist.offsets[r]:hist.offsets[r + 1]]   # row r's list

Like the C++ readers (data/dataset_file.h), every byte is covered by a CRC-32C
that is verified before data is returned, and the structure (magic numbers,
lengths, offsets, array codings, the footer's block index) is checked, so a
truncated or corrupt file raises RfdError naming the file, the block and the
byte offset, never returns wrong rows. A file of a format version this reader
does not know raises UnsupportedVersionError (a subclass) saying which version
it is.

Version 2 files may store histories by reference into a sibling sequence file
(`sequences.rfs`, written by `recfleet data ingest`); as in the C++ readers
(data/sequences.h) the referenced features (history_items, ...) are rebuilt
and presented after the stored ones, so `features` and the rows are the same
as with histories stored inline. The sequence file is read whole, once per
process while any file naming it is open.

Only reading; files are written by `recfleet data ingest` / `data synth` or
the C++ DatasetWriter.
"""

import builtins
import os
import struct
import threading
import weakref

import crc32c as _crc32c
import numpy as np

FORMAT_VERSIONS = (1, 2)
FORMAT_VERSION = FORMAT_VERSIONS[-1]  # The newest version this reader implements.
_FILE_MAGIC = b"RFDSET\x00"  # followed by the version byte
_TAIL_MAGIC = b"RFDSEND1"
_BLOCK_MAGIC = 0x4B424652  # "RFBK"
_FOOTER_MAGIC = 0x54464652  # "RFFT"
_HEADER_FIXED = 12  # magic, schema length
_BLOCK_HEADER = 24  # magic, rows, payload length, payload crc, header crc
_FOOTER_FIXED = 16  # magic, num_blocks, num_rows
_FOOTER_ENTRY = 12  # offset u64, rows u32
_TAIL = 16  # footer offset u64, tail magic
_DTYPES = {1: np.dtype("<i8"), 2: np.dtype("<f4")}
_LAYOUTS = {1: False, 2: True}  # scalar, jagged
_INT64 = _DTYPES[1]
_OFFSET = np.dtype("<u8")
_RAW, _DELTA_VARINT = 0, 1  # Version 2 array codings.

# Histories by reference (data/sequences.h).
_SEQUENCE_FILE = "sequence.file"
_SEQUENCE_ID = "sequence.id"
_SEQUENCE_FEATURE = "sequence.feature."
_HISTORY_SEQ, _HISTORY_END, _HISTORY_LEN = "history_seq", "history_end", "history_len"


class RfdError(Exception):
    """A file that is not an intact .rfd file (the C++ reader's DATA_LOSS)."""


class UnsupportedVersionError(RfdError):
    """An .rfd file of a format version this reader does not implement."""


class Feature:
    """One column: `dtype` int64 or float32; `jagged` if each row holds a list."""

    def __init__(self, name, dtype, jagged, table):
        self.name, self.dtype, self.jagged, self.table = name, dtype, jagged, table

    def __repr__(self):
        kind = "jagged" if self.jagged else "scalar"
        return f"Feature({self.name!r}, {self.dtype.name}, {kind}, table={self.table!r})"


class Jagged:
    """A list-per-row column: row r is values[offsets[r]:offsets[r + 1]]."""

    def __init__(self, values, offsets):
        self.values = values
        self.offsets = offsets

    def __len__(self):
        return len(self.offsets) - 1

    def row(self, r):
        return self.values[self.offsets[r]:self.offsets[r + 1]]

    def lengths(self):
        return np.diff(self.offsets)


def _crc(data):
    return _crc32c.crc32c(data)


def _decode_delta_varint(coded, count):
    """`count` int64 values from `coded` (uint8 array) as data/int_codec.h
    writes them, or None unless `coded` holds exactly `count` varints of at
    most 10 bytes. Differences are added back modulo 2^64, as in C++."""
    if count == 0:
        return np.zeros(0, _INT64) if len(coded) == 0 else None
    ends = coded < 0x80
    if len(coded) == 0 or not ends[-1] or int(np.count_nonzero(ends)) != count:
        return None
    last = np.flatnonzero(ends)
    first = np.concatenate(([0], last[:-1] + 1))
    if int(np.max(last - first)) > 9:  # A shift past 63 bits.
        return None
    position = np.arange(len(coded)) - np.repeat(first, last - first + 1)
    parts = (coded & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    zigzag = np.bitwise_or.reduceat(parts, first)
    deltas = (zigzag >> np.uint64(1)).view(np.int64) ^ -(zigzag & np.uint64(1)).view(np.int64)
    return np.cumsum(deltas, dtype=np.int64)  # Wraps like the C++ uint64 sum.


def _time_bucket(now, then):
    """data/sequences.h TimeBucket, elementwise: floor(log2(1 + whole hours
    from `then` to `now`)), 0 when `then` is not earlier, at most 63."""
    later = now > then
    hours = np.where(later, now, 0).astype(np.uint64) - np.where(later, then, 0).astype(np.uint64)
    x = hours // np.uint64(3600) + np.uint64(1)
    # float64 log2 can be one off near powers of two above 2^53: correct it.
    b = np.floor(np.log2(x.astype(np.float64))).astype(np.uint64)
    b = np.minimum(b, np.uint64(63))
    b = np.where((x >> b) == 0, b - np.uint64(1), b)
    b = np.where((b < 63) & ((x >> np.minimum(b + np.uint64(1), np.uint64(63))) != 0),
                 b + np.uint64(1), b)
    return np.where(later, b.astype(np.int64), 0)


class _SequenceStore:
    """A sequence file decoded whole: one row per sequence, every column a
    jagged int64 column of the same row lengths (data/sequences.h)."""

    _open = weakref.WeakValueDictionary()  # (real path, id, mtime, size) -> store
    _loading = threading.local()  # Set while this thread reads a sequence file.

    @classmethod
    def get(cls, path, sequence_id):
        # A sequence file naming a sequence file (itself, say) would recurse
        # without end; ingest never writes one.
        if getattr(cls._loading, "active", False):
            raise RfdError(f"{path}: named by a sequence file, whose events must be stored "
                           f"inline")
        st = os.stat(path)
        key = (os.path.realpath(path), sequence_id, st.st_mtime_ns, st.st_size)
        store = cls._open.get(key)
        if store is None:
            cls._loading.active = True
            try:
                store = cls(path, sequence_id)
            finally:
                cls._loading.active = False
            cls._open[key] = store
        return store

    def __init__(self, path, sequence_id):
        with RfdFile(path) as f:
            stored = f.metadata.get(_SEQUENCE_ID)
            if stored != sequence_id:
                raise RfdError(f"{path}: sequence id '{stored or ''}' is not the "
                               f"'{sequence_id}' its sample files expect: the files come from "
                               f"different ingests; re-ingest")
            for feature in f.features:
                if feature.dtype != _INT64 or not feature.jagged:
                    raise RfdError(f"{path}: sequence column '{feature.name}' is not a jagged "
                                   f"int64 column")
            if not f.features:
                raise RfdError(f"{path}: no sequence columns")
            self.names = [x.name for x in f.features]
            columns = f.read()
        first = columns[self.names[0]]
        for name in self.names[1:]:
            lengths = columns[name].offsets
            if not np.array_equal(lengths, first.offsets):
                r = int(np.argmax(np.diff(lengths) != np.diff(first.offsets)))
                raise RfdError(f"{path}: row {r}: column '{name}' has "
                               f"{int(np.diff(lengths)[r])} events, column '{self.names[0]}' "
                               f"{int(np.diff(first.offsets)[r])}")
        self.offsets = first.offsets
        self.columns = [columns[name].values for name in self.names]

    @property
    def num_sequences(self):
        return len(self.offsets) - 1


class _Derived:
    """A feature rebuilt from a sequence column: `column` its index in the
    store, `anchor` the stored scalar time_bucket measures from (or None)."""

    def __init__(self, feature, column, anchor):
        self.feature, self.column, self.anchor = feature, column, anchor


class RfdFile:
    """An open .rfd file: schema, metadata and block index, read and checked
    at open(); blocks are read and checked on demand. Not thread-safe."""

    def __init__(self, path):
        self.path = str(path)
        self._f = builtins.open(self.path, "rb")
        try:
            self._open()
        except BaseException:
            self._f.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._f.close()

    def _corrupt(self, block, offset, what):
        where = f"block {block} at byte offset {offset}" if block >= 0 else f"byte offset {offset}"
        return RfdError(f"{self.path}: {where}: {what}")

    def _read_at(self, offset, n, block, what):
        self._f.seek(offset)
        data = self._f.read(n)
        if len(data) != n:
            raise self._corrupt(block, offset,
                                f"file is truncated: {what} needs {n} bytes, {len(data)} left")
        return data

    def _open(self):
        self._f.seek(0, 2)
        size = self._f.tell()
        fixed = self._read_at(0, min(size, _HEADER_FIXED), -1, "the file header")
        if len(fixed) < 8 or fixed[:7] != _FILE_MAGIC:
            raise RfdError(f"{self.path}: not a recfleet dataset file (bad magic)")
        self.version = fixed[7]
        if self.version not in FORMAT_VERSIONS:
            raise UnsupportedVersionError(
                f"{self.path}: .rfd format version {self.version}; this reader implements "
                f"versions {', '.join(map(str, FORMAT_VERSIONS))} (data/FORMAT.md): update the "
                f"recfleet Python package, or re-ingest with this version.")
        min_size = _HEADER_FIXED + 4 + _FOOTER_FIXED + 4 + _TAIL
        if size < min_size:
            raise self._corrupt(-1, size, f"file is truncated: {size} bytes, a dataset file has "
                                          f"at least {min_size}")
        (schema_len,) = struct.unpack_from("<I", fixed, 8)
        header_end = _HEADER_FIXED + schema_len + 4
        tail = self._read_at(size - _TAIL, _TAIL, -1, "the tail")
        if tail[8:] != _TAIL_MAGIC:
            raise self._corrupt(-1, size - 8, "file is truncated or its tail is corrupt "
                                              "(bad end magic)")
        (footer_offset,) = struct.unpack_from("<Q", tail, 0)
        if (header_end > size - _TAIL or footer_offset < header_end
                or footer_offset > size - _TAIL - _FOOTER_FIXED - 4):
            raise self._corrupt(-1, size - _TAIL, f"footer offset {footer_offset} or schema "
                                                  f"length {schema_len} out of range for a file "
                                                  f"of {size} bytes")
        header = self._read_at(0, header_end, -1, "the schema")
        (stored,) = struct.unpack_from("<I", header, header_end - 4)
        # Version 2's checksum covers the magic too, so a flipped version byte
        # cannot make a reader take a file for the other version.
        if _crc(header[0 if self.version >= 2 else 8:header_end - 4]) != stored:
            raise self._corrupt(-1, 8, "file header (schema) checksum mismatch")
        self.stored_features, self.metadata = self._parse_schema(
            header[_HEADER_FIXED:header_end - 4])

        footer = self._read_at(footer_offset, size - _TAIL - footer_offset, -1, "the footer")
        magic, n = struct.unpack_from("<II", footer, 0)
        if magic != _FOOTER_MAGIC or len(footer) != _FOOTER_FIXED + n * _FOOTER_ENTRY + 4:
            raise self._corrupt(-1, footer_offset, "bad footer magic or size")
        if _crc(footer[:-4]) != struct.unpack_from("<I", footer, len(footer) - 4)[0]:
            raise self._corrupt(-1, footer_offset, "footer checksum mismatch")
        (self.num_rows,) = struct.unpack_from("<Q", footer, 8)
        self._blocks = []  # (offset, size, rows)
        expect, total = header_end, 0
        for i in range(n):
            offset, rows = struct.unpack_from("<QI", footer, _FOOTER_FIXED + i * _FOOTER_ENTRY)
            if offset != expect:
                raise self._corrupt(i, offset, "footer index: block does not follow the "
                                               "previous one")
            end = (struct.unpack_from("<Q", footer, _FOOTER_FIXED + (i + 1) * _FOOTER_ENTRY)[0]
                   if i + 1 < n else footer_offset)
            if end < offset + _BLOCK_HEADER or end > footer_offset:
                raise self._corrupt(i, offset, "footer index: block extent out of range")
            self._blocks.append((offset, end - offset, rows))
            expect, total = end, total + rows
        if expect != footer_offset:
            raise self._corrupt(-1, footer_offset, "footer index: blocks do not reach the footer")
        if total != self.num_rows:
            raise self._corrupt(-1, footer_offset, f"footer says {self.num_rows} rows, its "
                                                   f"blocks hold {total}")
        self._resolve_references()

    def _resolve_references(self):
        """Sets `features` (the stored ones, then those rebuilt from a
        sequence file) and, for a file with histories by reference, the
        sequence store and how each feature is rebuilt (data/sequences.cc)."""
        self.features = list(self.stored_features)
        self._store, self._derived = None, []
        seq_file = self.metadata.get(_SEQUENCE_FILE)
        if seq_file is None:
            return

        def bad(what):
            return RfdError(f"{self.path}: {what}")

        sequence_id = self.metadata.get(_SEQUENCE_ID)
        if sequence_id is None:
            raise bad(f"no {_SEQUENCE_ID} metadata")
        if "/" in seq_file:
            raise bad(f"sequence file '{seq_file}' must be a plain file name")
        self._seq_col, self._end_col, self._len_col = (
            self._require(name, bad) for name in (_HISTORY_SEQ, _HISTORY_END, _HISTORY_LEN))
        seq_path = os.path.join(os.path.dirname(self.path), seq_file)
        try:
            self._store = _SequenceStore.get(seq_path, sequence_id)
        except (OSError, RfdError) as e:
            why = f"{seq_path}: cannot open: {e.strerror}" if isinstance(e, OSError) else str(e)
            raise RfdError(f"{self.path}: its histories are stored in {seq_file} next to it, "
                           f"which is unusable ({why}); keep the files of one ingest together, "
                           f"or re-ingest") from e
        names = {f.name for f in self.features}
        for key in sorted(k for k in self.metadata if k.startswith(_SEQUENCE_FEATURE)):
            value = self.metadata[key]
            parts = value.split("|")
            if len(parts) != 2:
                raise bad(f"{key} = '{value}': want TABLE|SOURCE")
            table, column = parts
            anchor = None
            if column.startswith("time_bucket:"):
                tb = column.split(":")
                if len(tb) != 3:
                    raise bad(f"{key}: want time_bucket:COLUMN:FEATURE")
                anchor, column = self._require(tb[2], bad), tb[1]
            if column not in self._store.names:
                raise bad(f"{key}: the sequence file has no column '{column}'")
            name = key[len(_SEQUENCE_FEATURE):]
            if name in names:
                raise bad(f"{key}: feature '{name}' is also stored")
            names.add(name)
            feature = Feature(name, _INT64, True, table)
            self.features.append(feature)
            self._derived.append(_Derived(feature, self._store.names.index(column), anchor))

    def _require(self, name, bad):
        """The stored scalar int64 feature `name` (Schema::Require)."""
        for f in self.stored_features:
            if f.name == name:
                if f.dtype != _INT64 or f.jagged:
                    kind = "jagged" if f.jagged else "scalar"
                    raise bad(f"feature '{name}' is {kind} {f.dtype.name}; expected scalar int64")
                return name
        raise bad(f"dataset has no feature '{name}' (expected a scalar int64 column)")

    def _parse_schema(self, data):
        pos = 0

        def take(n, what):
            nonlocal pos
            if pos + n > len(data):
                raise self._corrupt(-1, _HEADER_FIXED + pos, f"schema: truncated {what}")
            out = data[pos:pos + n]
            pos += n
            return out

        def u(fmt, what):
            return struct.unpack("<" + fmt, take(struct.calcsize(fmt), what))[0]

        features, names = [], set()
        for _ in range(u("I", "feature count")):
            dtype, layout = u("B", "feature type"), u("B", "feature type")
            name = take(u("H", "feature name"), "feature name").decode("utf-8", "replace")
            table = take(u("H", "table name"), "table name").decode("utf-8", "replace")
            if dtype not in _DTYPES or layout not in _LAYOUTS:
                raise self._corrupt(-1, _HEADER_FIXED, f"schema: feature '{name}': unknown "
                                                       f"dtype {dtype} or layout {layout}")
            if not name or name in names:
                raise self._corrupt(-1, _HEADER_FIXED, f"schema: empty or repeated feature "
                                                       f"name '{name}'")
            names.add(name)
            features.append(Feature(name, _DTYPES[dtype], _LAYOUTS[layout], table))
        metadata = {}
        for _ in range(u("I", "metadata count")):
            key = take(u("I", "metadata key"), "metadata key").decode("utf-8", "replace")
            metadata[key] = take(u("I", "metadata value"), "metadata value").decode(
                "utf-8", "replace")
        if pos != len(data):
            raise self._corrupt(-1, _HEADER_FIXED + pos, "schema: trailing bytes")
        return features, metadata

    @property
    def num_blocks(self):
        return len(self._blocks)

    def read_block(self, index, columns=None):
        """Block `index` as {name: ndarray or Jagged} (offsets start at 0)."""
        offset, size, expected_rows = self._blocks[index]
        data = self._read_at(offset, size, index, "the block")
        magic, rows, payload_len, payload_crc, header_crc = struct.unpack_from("<IIQII", data, 0)
        if magic != _BLOCK_MAGIC:
            raise self._corrupt(index, offset, "bad block magic")
        if _crc(data[:20]) != header_crc:
            raise self._corrupt(index, offset, "block header checksum mismatch")
        if rows != expected_rows:
            raise self._corrupt(index, offset, f"block has {rows} rows, footer index says "
                                               f"{expected_rows}")
        if payload_len != size - _BLOCK_HEADER:
            raise self._corrupt(index, offset, f"payload length {payload_len} disagrees with the "
                                               f"block extent {size - _BLOCK_HEADER}")
        payload = memoryview(data)[_BLOCK_HEADER:]
        crc = _crc(payload)
        if crc != payload_crc:
            raise self._corrupt(index, offset + _BLOCK_HEADER,
                                f"payload checksum mismatch (stored 0x{payload_crc:08x}, "
                                f"computed 0x{crc:08x})")
        stored, pos = {}, 0
        base = offset + _BLOCK_HEADER

        def take(n, what, name):
            if n > payload_len - pos:
                raise self._corrupt(index, base + pos, f"feature '{name}': {what} needs {n} "
                                                       f"bytes, payload has {payload_len - pos} "
                                                       f"left")

        def array(count, dtype, what, name):
            """The next array of `count` elements (in place if raw)."""
            nonlocal pos
            coding = _RAW
            if self.version >= 2:
                take(1, what, name)
                coding = payload[pos]
                pos += 1
            if coding == _RAW:
                take(count * dtype.itemsize, what, name)
                pos += count * dtype.itemsize
                return np.frombuffer(payload, dtype, count, pos - count * dtype.itemsize)
            if coding != _DELTA_VARINT or dtype.itemsize != 8:
                raise self._corrupt(index, base + pos - 1, f"feature '{name}': {what}: unknown "
                                                           f"coding {coding}")
            take(8, what, name)
            (length,) = struct.unpack_from("<Q", payload, pos)
            pos += 8
            take(length, what, name)
            if count > length:  # A varint is at least one byte.
                raise self._corrupt(index, base + pos, f"feature '{name}': {what}: {count} "
                                                       f"values cannot fit in {length} coded "
                                                       f"bytes")
            values = _decode_delta_varint(np.frombuffer(payload, np.uint8, length, pos), count)
            if values is None:
                raise self._corrupt(index, base + pos, f"feature '{name}': {what}: bad "
                                                       f"delta+varint coding")
            pos += length
            return values.view(dtype)

        for f in self.stored_features:
            count = rows
            offsets = None
            if f.jagged:
                at_offsets = base + pos
                offsets = array(rows + 1, _OFFSET, "offsets", f.name)
                if offsets[0] != 0:
                    raise self._corrupt(index, at_offsets, f"feature '{f.name}': first offset "
                                                           f"is not 0")
                decreasing = offsets[1:] < offsets[:-1]
                if decreasing.any():
                    r = int(np.argmax(decreasing))
                    raise self._corrupt(index, at_offsets,
                                        f"feature '{f.name}': offsets decrease at row {r}")
                count = int(offsets[-1])
                if count > payload_len:
                    raise self._corrupt(index, base + pos, f"feature '{f.name}': {count} values "
                                                           f"exceed the payload")
            values = array(count, f.dtype, "values", f.name)
            stored[f.name] = Jagged(values, offsets.astype(np.int64)) if f.jagged else values
        if pos != payload_len:
            raise self._corrupt(index, base + pos, f"{payload_len - pos} unexpected bytes after "
                                                   f"the last column")
        if self._store is not None:
            self._check_references(index, offset, stored)
        out = {name: col for name, col in stored.items() if columns is None or name in columns}
        for d in self._derived:
            if columns is None or d.feature.name in columns:
                out[d.feature.name] = self._rebuild(d, stored)
        return out

    def _check_references(self, index, offset, stored):
        seq, end, length = (stored[c] for c in (self._seq_col, self._end_col, self._len_col))
        store = self._store
        ok = (seq >= 0) & (seq < store.num_sequences) & (length >= 0) & (length <= end)
        safe = np.where(ok, seq, 0)
        ok &= end <= np.diff(store.offsets)[safe] if store.num_sequences else False
        if not np.all(ok):
            r = int(np.argmin(ok))
            raise self._corrupt(index, offset, f"row {r}: history reference (sequence "
                                               f"{seq[r]}, end {end[r]}, length {length[r]}) lies "
                                               f"outside the sequence file")

    def _rebuild(self, d, stored):
        """Derived feature `d` of a block's rows: each row's window
        [end - len, end) of its sequence (data/sequences.cc Append)."""
        seq, end, length = (stored[c] for c in (self._seq_col, self._end_col, self._len_col))
        offsets = np.zeros(len(seq) + 1, np.int64)
        np.cumsum(length, out=offsets[1:])
        starts = self._store.offsets[seq] + end - length
        index = np.repeat(starts - offsets[:-1], length) + np.arange(offsets[-1])
        values = self._store.columns[d.column][index]
        if d.anchor is not None:
            values = _time_bucket(np.repeat(stored[d.anchor], length), values)
        return Jagged(values, offsets)

    def blocks(self, columns=None):
        """Yields every block in order, as read_block() returns it."""
        for i in range(self.num_blocks):
            yield self.read_block(i, columns)

    def read(self, columns=None):
        """Every row: {name: ndarray} for scalar columns, {name: Jagged} for
        jagged ones; `columns` (names) restricts what is returned (every
        block is still checked whole)."""
        wanted = [f for f in self.features if columns is None or f.name in columns]
        missing = set(columns or ()) - {f.name for f in self.features}
        if missing:
            raise KeyError(f"{self.path}: no feature {sorted(missing)}; it has "
                           f"{[f.name for f in self.features]}")
        parts = {f.name: [] for f in wanted}
        for block in self.blocks(columns):
            for f in wanted:
                parts[f.name].append(block[f.name])
        out = {}
        for f in wanted:
            if not f.jagged:
                out[f.name] = (np.concatenate(parts[f.name]) if parts[f.name]
                               else np.empty(0, f.dtype))
                continue
            values = [j.values for j in parts[f.name]]
            offsets, shift = [np.zeros(1, np.int64)], 0
            for j in parts[f.name]:
                offsets.append(j.offsets[1:] + shift)
                shift += int(j.offsets[-1])
            out[f.name] = Jagged(np.concatenate(values) if values else np.empty(0, f.dtype),
                                 np.concatenate(offsets))
        return out


def open(path):  # noqa: A001 (the module's entry point reads as rfd.open)
    """Opens an .rfd file, checking its header, footer and block index."""
    return RfdFile(path)


def read(path, columns=None):
    """Reads every row of an .rfd file: see RfdFile.read()."""
    with RfdFile(path) as f:
        return f.read(columns)
