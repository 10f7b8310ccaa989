"""Reads recfleet dataset files (.rfd, data/FORMAT.md, version 1) into numpy.

    ds = recfleet.rfd.open("train.rfd")      # header, footer and block index checked
    cols = ds.read()                          # {name: ndarray or Jagged}, every block checked
    cols["label"]                             # float32, one value per row
    hist = cols["history_items"]              # Jagged: hist.values, hist.offsets (num_rows + 1)
    hist.values[hist.offsets[r]:hist.offsets[r + 1]]   # row r's list

Like the C++ reader (data/dataset_file.h), every byte is covered by a CRC-32C
that is verified before data is returned, and the structure (magic numbers,
lengths, offsets, the footer's block index) is checked, so a truncated or
corrupt file raises RfdError naming the file, the block and the byte offset,
never returns wrong rows. A file of a format version this reader does not
know raises UnsupportedVersionError (a subclass) saying which version it is.

Only reading; files are written by `recfleet data ingest` / `data synth` or
the C++ DatasetWriter.
"""

import builtins
import struct

import crc32c as _crc32c
import numpy as np

FORMAT_VERSION = 1
_FILE_MAGIC = b"RFDSET"  # followed by the version, big-endian u16 (bytes 0x00 0x01)
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
_OFFSET = np.dtype("<u8")


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
        if len(fixed) < 8 or fixed[:6] != _FILE_MAGIC:
            raise RfdError(f"{self.path}: not a recfleet dataset file (bad magic)")
        version = int.from_bytes(fixed[6:8], "big")
        if version != FORMAT_VERSION:
            raise UnsupportedVersionError(
                f"{self.path}: .rfd format version {version}; this reader implements version "
                f"{FORMAT_VERSION} only (data/FORMAT.md). Read it with the recfleet release that "
                f"wrote it, or update the recfleet Python package.")
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
        if _crc(header[8:header_end - 4]) != stored:
            raise self._corrupt(-1, 8, "file header (schema) checksum mismatch")
        self.features, self.metadata = self._parse_schema(header[_HEADER_FIXED:header_end - 4])

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
            if end < offset + _BLOCK_HEADER:
                raise self._corrupt(i, offset, "footer index: block shorter than its header")
            self._blocks.append((offset, end - offset, rows))
            expect, total = end, total + rows
        if expect != footer_offset:
            raise self._corrupt(-1, footer_offset, "footer index: blocks do not reach the footer")
        if total != self.num_rows:
            raise self._corrupt(-1, footer_offset, f"footer says {self.num_rows} rows, its "
                                                   f"blocks hold {total}")

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
        out, pos = {}, 0
        base = offset + _BLOCK_HEADER

        def take(n, what, name):
            if n > payload_len - pos:
                raise self._corrupt(index, base + pos, f"feature '{name}': {what} needs {n} "
                                                       f"bytes, payload has {payload_len - pos} "
                                                       f"left")

        for f in self.features:
            count = rows
            offsets = None
            if f.jagged:
                n = (rows + 1) * 8
                take(n, "offsets", f.name)
                offsets = np.frombuffer(payload, _OFFSET, rows + 1, pos)
                if offsets[0] != 0:
                    raise self._corrupt(index, base + pos, f"feature '{f.name}': first offset "
                                                           f"is not 0")
                decreasing = offsets[1:] < offsets[:-1]
                if decreasing.any():
                    r = int(np.argmax(decreasing))
                    raise self._corrupt(index, base + pos + 8 * (r + 1),
                                        f"feature '{f.name}': offsets decrease at row {r}")
                pos += n
                count = int(offsets[-1])
                if count > payload_len:
                    raise self._corrupt(index, base + pos, f"feature '{f.name}': {count} values "
                                                           f"exceed the payload")
            n = count * f.dtype.itemsize
            take(n, "values", f.name)
            if columns is None or f.name in columns:
                values = np.frombuffer(payload, f.dtype, count, pos)
                out[f.name] = Jagged(values, offsets.astype(np.int64)) if f.jagged else values
            pos += n
        if pos != payload_len:
            raise self._corrupt(index, base + pos, f"columns end at payload byte {pos}, the "
                                                   f"payload has {payload_len}")
        return out

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
