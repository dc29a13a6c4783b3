"""Writes the Hugging Face `datasets` fixtures of tests/fixtures/datasets/.

One small text corpus and one small pairs set, each written in every format redco reads:

  texts.jsonl                the reference: one JSON object per line
  texts.parquet              datasets' to_parquet
  texts_disk/                datasets' save_to_disk (Arrow IPC streaming format + state.json)
  texts_dict/                a DatasetDict (train and test splits) saved with save_to_disk
  texts_rowgroups.parquet    pyarrow, row groups of 7 rows (exercises the row index)
  texts_file.arrow           the Arrow IPC *file* format, record batches of 9 rows
  texts_stream.arrow         the Arrow IPC streaming format, record batches of 9 rows
  types.parquet              one row of each simple column type (ints, floats, bools, nulls,
                             lists, structs, large and dictionary-encoded strings)
  types.jsonl                what each of types.parquet's rows reads as
  pairs.jsonl / pairs.parquet / pairs_disk/   source/target pairs

Usage: python gen_datasets.py --out tests/fixtures/datasets
(needs `datasets` and `pyarrow`; the outputs are committed, so CI never runs this).
"""

import argparse
import json
import os
import shutil

import datasets
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven small birds sing softly "
    "in tall green trees near an old stone bridge under the bright morning sun"
).split()


def corpus(n=40):
    """`n` short deterministic lines (a linear congruential walk over WORDS)."""
    x, lines = 7, []
    for i in range(n):
        k = 4 + i % 6
        words = []
        for _ in range(k):
            x = (x * 1103515245 + 12345) % (1 << 31)
            words.append(WORDS[x % len(WORDS)])
        lines.append(" ".join(words) + ("." if i % 3 else "!"))
    return lines


def pairs(n=24):
    """Source/target pairs: a line and the same words reversed."""
    lines = corpus(n)
    return [{"source": s, "target": " ".join(reversed(s.rstrip(".!").split()))} for s in lines]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def clean(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)

    rows = [{"id": i, "text": t} for i, t in enumerate(corpus())]
    write_jsonl(os.path.join(out, "texts.jsonl"), rows)
    ds = datasets.Dataset.from_list(rows)
    for name in ["texts.parquet", "texts_disk", "texts_dict"]:
        clean(os.path.join(out, name))
    ds.to_parquet(os.path.join(out, "texts.parquet"))
    ds.save_to_disk(os.path.join(out, "texts_disk"), num_shards=2)
    split = datasets.DatasetDict({"train": ds.select(range(30)), "test": ds.select(range(30, len(ds)))})
    split.save_to_disk(os.path.join(out, "texts_dict"))

    table = pa.Table.from_pylist(rows)
    pq.write_table(table, os.path.join(out, "texts_rowgroups.parquet"), row_group_size=7)
    with ipc.new_file(os.path.join(out, "texts_file.arrow"), table.schema) as w:
        for b in table.to_batches(max_chunksize=9):
            w.write_batch(b)
    with ipc.new_stream(os.path.join(out, "texts_stream.arrow"), table.schema) as w:
        for b in table.to_batches(max_chunksize=9):
            w.write_batch(b)

    types = pa.table(
        {
            "i8": pa.array([1, -2, None], pa.int8()),
            "u64": pa.array([0, 18446744073709551615, 3], pa.uint64()),
            "f32": pa.array([0.5, -1.25, None], pa.float32()),
            "f64": pa.array([1e-3, 2.5, 3.0], pa.float64()),
            "flag": pa.array([True, False, None]),
            "large": pa.array(["a", "b\u00e9", None], pa.large_string()),
            "dict": pa.array(["x", "y", "x"]).dictionary_encode(),
            "list": pa.array([[1, 2], [], None], pa.list_(pa.int32())),
            "obj": pa.array([{"a": 1, "b": "p"}, {"a": None, "b": "q"}, None]),
            "nothing": pa.nulls(3),
        }
    )
    pq.write_table(types, os.path.join(out, "types.parquet"), row_group_size=2)
    write_jsonl(os.path.join(out, "types.jsonl"), types.to_pylist())

    prs = pairs()
    write_jsonl(os.path.join(out, "pairs.jsonl"), prs)
    pds = datasets.Dataset.from_list(prs)
    for name in ["pairs.parquet", "pairs_disk"]:
        clean(os.path.join(out, name))
    pds.to_parquet(os.path.join(out, "pairs.parquet"))
    pds.save_to_disk(os.path.join(out, "pairs_disk"))


if __name__ == "__main__":
    main()
