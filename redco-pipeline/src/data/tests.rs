//! The `datasets` readers against the committed fixtures (tests/fixtures/datasets, written by
//! xtask/python/gen_datasets.py): every format reads exactly the JSONL records, in any order;
//! splits, missing columns and corrupt files are clear errors, never panics.

use super::{open, open_split, Dataset, JsonlDataset, TableDataset};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/datasets").join(name)
}

fn rows(d: &dyn Dataset<Value>) -> Vec<Value> {
    (0..d.len()).map(|i| d.get(i).unwrap_or_else(|e| panic!("row {i}: {e}"))).collect()
}

fn jsonl(name: &str) -> Vec<Value> {
    rows(&JsonlDataset::open(&fixture(name)).expect("jsonl fixture"))
}

/// `got` equals `want` record by record and field by field.
fn same(what: &str, got: &[Value], want: &[Value]) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.as_object().expect("object"), w.as_object().expect("object"));
        assert_eq!(g.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>(), "{what} row {i}: fields");
        for (k, v) in w {
            assert_eq!(&g[k], v, "{what} row {i} field {k}");
        }
    }
}

#[test]
fn every_format_reads_the_jsonl_records() {
    let want = jsonl("texts.jsonl");
    assert_eq!(want.len(), 40);
    for name in [
        "texts.jsonl",
        "texts.parquet",
        "texts_rowgroups.parquet",
        "texts_file.arrow",
        "texts_stream.arrow",
        "texts_disk",
    ] {
        let d = open(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        same(name, &rows(d.as_ref()), &want);
    }
    // the train split of the DatasetDict by default, the test split when chosen
    same("texts_dict", &rows(open(&fixture("texts_dict")).unwrap().as_ref()), &want[..30]);
    let test = open_split(&fixture("texts_dict"), Some("test")).unwrap();
    same("texts_dict test", &rows(test.as_ref()), &want[30..]);
    // the pairs and one row of each column type
    let pairs = jsonl("pairs.jsonl");
    for name in ["pairs.parquet", "pairs_disk"] {
        same(name, &rows(open(&fixture(name)).unwrap().as_ref()), &pairs);
    }
    same("types.parquet", &rows(open(&fixture("types.parquet")).unwrap().as_ref()), &jsonl("types.jsonl"));
}

#[test]
fn the_row_index_spans_row_groups_batches_and_shards_in_any_order() {
    let want = jsonl("texts.jsonl");
    let cases = [
        ("texts_rowgroups.parquet", TableDataset::parquet(&fixture("texts_rowgroups.parquet")).unwrap(), 6),
        ("texts_file.arrow", TableDataset::arrow(&fixture("texts_file.arrow")).unwrap(), 5),
        ("texts_stream.arrow", TableDataset::arrow(&fixture("texts_stream.arrow")).unwrap(), 5),
        ("texts_disk", TableDataset::hf_disk(&fixture("texts_disk"), None).unwrap(), 2),
    ];
    for (name, d, blocks) in cases {
        assert_eq!(d.blocks(), blocks, "{name}: blocks");
        assert_eq!(d.columns(), ["id", "text"], "{name}");
        // a seeded walk that jumps between blocks, back and forth, and repeats rows
        let mut x = 17u64;
        for _ in 0..200 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let i = (x >> 33) as usize % want.len();
            assert_eq!(d.get(i).unwrap(), want[i], "{name} row {i}");
        }
        for i in (0..want.len()).rev() {
            assert_eq!(d.get(i).unwrap(), want[i], "{name} row {i}");
        }
        let e = d.get(want.len()).unwrap_err().to_string();
        assert!(e.contains("out of 40"), "{e}");
    }
}

#[test]
fn splits_and_columns_that_are_not_there_are_named() {
    let e = open_split(&fixture("texts_dict"), Some("validation")).err().expect("no such split").to_string();
    assert!(e.contains("validation") && e.contains("`train`, `test`") && e.contains("texts_dict"), "{e}");
    let e = open_split(&fixture("texts_disk"), Some("train")).err().expect("not a dict").to_string();
    assert!(e.contains("texts_disk") && e.contains("not a DatasetDict"), "{e}");
    let e = open_split(&fixture("texts.parquet"), Some("train")).err().expect("no splits").to_string();
    assert!(e.contains("texts.parquet"), "{e}");
    for name in ["texts.parquet", "texts_disk", "texts_stream.arrow"] {
        let d = open(&fixture(name)).unwrap();
        d.require_field("text").unwrap();
        let e = d.require_field("content").unwrap_err().to_string();
        assert!(e.contains("`content`") && e.contains("`id`, `text`") && e.contains(name), "{e}");
    }
    // JSONL has no schema: it answers record by record
    open(&fixture("texts.jsonl")).unwrap().require_field("content").unwrap();
    let e = open(&fixture("texts.csv")).err().expect("unknown format").to_string();
    assert!(e.contains("texts.csv") && e.contains("unknown data format"), "{e}");
}

#[test]
fn other_extensions_are_recognised_by_their_first_bytes() {
    let d = scratch("sniff");
    let jsonl = open(&fixture("texts.jsonl")).unwrap();
    for (from, to) in
        [("texts.jsonl", "texts.txt"), ("texts.parquet", "texts.bin"), ("texts_stream.arrow", "texts.dat")]
    {
        std::fs::copy(fixture(from), d.join(to)).unwrap();
        let t = open(&d.join(to)).unwrap();
        assert_eq!(t.len(), jsonl.len(), "{to}");
        assert_eq!(t.get(3).unwrap()["text"], jsonl.get(3).unwrap()["text"], "{to}");
    }
    std::fs::write(d.join("texts.csv"), "id,text\n0,hello\n").unwrap();
    let e = open(&d.join("texts.csv")).err().expect("csv is not a format").to_string();
    assert!(e.contains("unknown data format"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch");
    d
}

/// Opens `path` and reads every row: Ok, or an error that names `path`'s file.
fn read_all_or_named_error(path: &Path) {
    let name = path.file_name().and_then(|n| n.to_str()).expect("name");
    let r = open(path).and_then(|d| (0..d.len()).try_for_each(|i| d.get(i).map(|_| ())));
    if let Err(e) = r {
        assert!(e.to_string().contains(name), "error without the file's name: {e}");
    }
}

#[test]
fn cut_and_flipped_files_are_errors_naming_them_never_panics() {
    let d = scratch("corrupt");
    for name in ["texts.parquet", "texts_rowgroups.parquet", "texts_file.arrow", "texts_stream.arrow", "types.parquet"]
    {
        let bytes = std::fs::read(fixture(name)).unwrap();
        let ext = Path::new(name).extension().and_then(|e| e.to_str()).unwrap();
        let step = (bytes.len() / 61).max(1);
        for at in (0..bytes.len()).step_by(step) {
            let cut = d.join(format!("cut-{at}.{ext}"));
            std::fs::write(&cut, &bytes[..at]).unwrap();
            read_all_or_named_error(&cut);
            for flip in [0xff, 0x01, 0x80] {
                let mut b = bytes.clone();
                b[at] ^= flip;
                let f = d.join(format!("flip-{at}-{flip}.{ext}"));
                std::fs::write(&f, &b).unwrap();
                read_all_or_named_error(&f);
            }
        }
    }
    // a save_to_disk directory with a cut shard, a hostile state.json, a missing shard
    let disk = d.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    for f in ["state.json", "dataset_info.json", "data-00000-of-00002.arrow"] {
        std::fs::copy(fixture("texts_disk").join(f), disk.join(f)).unwrap();
    }
    let shard = std::fs::read(fixture("texts_disk/data-00001-of-00002.arrow")).unwrap();
    std::fs::write(disk.join("data-00001-of-00002.arrow"), &shard[..shard.len() / 2]).unwrap();
    let e = open(&disk).err().expect("cut shard").to_string();
    assert!(e.contains("data-00001-of-00002.arrow"), "{e}");
    std::fs::remove_file(disk.join("data-00001-of-00002.arrow")).unwrap();
    let e = open(&disk).err().expect("missing shard").to_string();
    assert!(e.contains("data-00001-of-00002.arrow"), "{e}");
    std::fs::write(disk.join("state.json"), r#"{"_data_files": [{"filename": "../../etc/passwd"}]}"#).unwrap();
    let e = open(&disk).err().expect("hostile").to_string();
    assert!(e.contains("state.json") && e.contains("passwd"), "{e}");
    std::fs::write(disk.join("state.json"), "{").unwrap();
    let e = open(&disk).err().expect("malformed").to_string();
    assert!(e.contains("state.json"), "{e}");
    let empty = d.join("empty-dir");
    std::fs::create_dir_all(&empty).unwrap();
    let e = open(&empty).err().expect("empty dir").to_string();
    assert!(e.contains("empty-dir") && e.contains("save_to_disk"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
