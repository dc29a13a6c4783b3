//! Arrow IPC files, in the file format (`ARROW1` magic, a footer listing the record
//! batches) and the streaming format (`datasets`' `save_to_disk` shards: messages one after
//! another). Both are indexed from the messages' metadata alone, without decoding a batch:
//! where each record batch (and dictionary batch) lies and how many rows it holds. A batch is
//! decoded when one of its rows is asked for, after the dictionaries before it.

use super::table::{guard, Blocks, TableDataset};
use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::convert::try_fb_to_schema;
use arrow_ipc::reader::{read_footer_length, FileDecoder};
use arrow_ipc::{Block, Message, MessageHeader, MetadataVersion};
use arrow_schema::SchemaRef;
use redco_core::{Error, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const MAGIC: &[u8; 6] = b"ARROW1";
const CONTINUATION: [u8; 4] = [0xff; 4];

/// One Arrow IPC file.
pub(crate) struct IpcFile {
    path: PathBuf,
    file: Mutex<File>,
    index: Index,
}

/// Where a file's messages lie.
struct Index {
    schema: SchemaRef,
    version: MetadataVersion,
    dictionaries: Vec<Block>,
    batches: Vec<Block>,
    rows: Vec<usize>,
}

fn bad(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::data("data", format!("{}: not a readable Arrow IPC file: {what}", path.display()))
}

/// `len` bytes at `offset` of `f` (of `size` bytes), checked to lie inside it.
fn read_at(f: &mut File, offset: u64, len: u64, size: u64, path: &Path) -> Result<Vec<u8>> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(bad(path, format!("{len} bytes at offset {offset} lie past its end ({size} bytes): cut short?")));
    }
    let len = usize::try_from(len).map_err(|_| bad(path, "a message larger than memory"))?;
    let mut buf = vec![0u8; len];
    f.seek(SeekFrom::Start(offset)).and_then(|_| f.read_exact(&mut buf)).map_err(|e| bad(path, e))?;
    Ok(buf)
}

/// The message whose metadata (with its length prefix) is `meta`.
fn message<'a>(meta: &'a [u8], path: &Path) -> Result<Message<'a>> {
    let fb = match meta {
        [0xff, 0xff, 0xff, 0xff, _, _, _, _, rest @ ..] => rest,
        [_, _, _, _, rest @ ..] => rest,
        _ => return Err(bad(path, "a message shorter than its length prefix")),
    };
    arrow_ipc::root_as_message(fb).map_err(|e| bad(path, format!("a malformed message: {e}")))
}

/// A block's (offset, metadata length, body length), checked to lie inside the file.
fn extent(b: &Block, size: u64, path: &Path) -> Result<(u64, u64, u64)> {
    let (o, m, l) = (u64::try_from(b.offset()), u64::try_from(b.metaDataLength()), u64::try_from(b.bodyLength()));
    match (o, m, l) {
        (Ok(o), Ok(m), Ok(l))
            if m >= 4 && o.checked_add(m).and_then(|e| e.checked_add(l)).is_some_and(|e| e <= size) =>
        {
            Ok((o, m, l))
        }
        _ => Err(bad(path, "a block that lies outside the file")),
    }
}

fn rows_of(msg: &Message<'_>, path: &Path) -> Result<usize> {
    let rb = msg.header_as_record_batch().ok_or_else(|| bad(path, "a record batch block holds another message"))?;
    usize::try_from(rb.length()).map_err(|_| bad(path, format!("a record batch of {} rows", rb.length())))
}

/// Indexes the file format: the footer lists the blocks; each batch's row count is read
/// from its metadata.
fn index_file(f: &mut File, size: u64, path: &Path) -> Result<Index> {
    if size < 16 {
        return Err(bad(path, "too short for the Arrow file format"));
    }
    let tail: [u8; 10] = read_at(f, size - 10, 10, size, path)?.try_into().map_err(|_| bad(path, "a short footer"))?;
    let footer_len = read_footer_length(tail).map_err(|e| bad(path, e))? as u64;
    let footer_bytes = read_at(f, (size - 10).saturating_sub(footer_len), footer_len, size - 10, path)?;
    let footer = arrow_ipc::root_as_footer(&footer_bytes).map_err(|e| bad(path, format!("a malformed footer: {e}")))?;
    let fb_schema = footer.schema().ok_or_else(|| bad(path, "no schema in the footer"))?;
    if !fb_schema.endianness().equals_to_target_endianness() {
        return Err(bad(path, "written on a machine of the other endianness"));
    }
    let schema = Arc::new(try_fb_to_schema(fb_schema).map_err(|e| bad(path, e))?);
    let dictionaries: Vec<Block> = footer.dictionaries().map(|d| d.iter().copied().collect()).unwrap_or_default();
    let batches: Vec<Block> = footer.recordBatches().map(|d| d.iter().copied().collect()).unwrap_or_default();
    let mut rows = Vec::with_capacity(batches.len());
    for b in dictionaries.iter().chain(&batches) {
        extent(b, size, path)?;
    }
    for b in &batches {
        let (o, m, _) = extent(b, size, path)?;
        let meta = read_at(f, o, m, size, path)?;
        rows.push(rows_of(&message(&meta, path)?, path)?);
    }
    Ok(Index { schema, version: footer.version(), dictionaries, batches, rows })
}

/// Indexes the streaming format in one pass over the messages' metadata (bodies skipped).
fn index_stream(f: &mut File, size: u64, path: &Path) -> Result<Index> {
    let (mut schema, mut version) = (None, MetadataVersion::V5);
    let (mut dictionaries, mut batches, mut rows) = (Vec::new(), Vec::new(), Vec::new());
    let mut p = 0u64;
    while p + 4 <= size {
        let word = read_at(f, p, 4, size, path)?;
        let (prefix, len) = if word == CONTINUATION {
            if p + 8 > size {
                break;
            }
            (8u64, read_at(f, p + 4, 4, size, path)?)
        } else {
            (4u64, word)
        };
        let len = i32::from_le_bytes([len[0], len[1], len[2], len[3]]);
        if len == 0 {
            break; // the end-of-stream marker
        }
        let len = u64::try_from(len).map_err(|_| bad(path, format!("a message of length {len} at offset {p}")))?;
        let meta_len = prefix + len;
        let meta = read_at(f, p, meta_len, size, path)?;
        let msg = message(&meta, path)?;
        let body = u64::try_from(msg.bodyLength()).map_err(|_| bad(path, "a message of negative body length"))?;
        let block = Block::new(
            i64::try_from(p).map_err(|_| bad(path, "offsets past 2^63"))?,
            i32::try_from(meta_len).map_err(|_| bad(path, "message metadata over 2 GiB"))?,
            msg.bodyLength(),
        );
        extent(&block, size, path)?;
        match msg.header_type() {
            MessageHeader::Schema if schema.is_none() => {
                let s = msg.header_as_schema().ok_or_else(|| bad(path, "a malformed schema message"))?;
                if !s.endianness().equals_to_target_endianness() {
                    return Err(bad(path, "written on a machine of the other endianness"));
                }
                schema = Some(Arc::new(try_fb_to_schema(s).map_err(|e| bad(path, e))?));
                version = msg.version();
            }
            MessageHeader::DictionaryBatch if schema.is_some() => dictionaries.push(block),
            MessageHeader::RecordBatch if schema.is_some() => {
                rows.push(rows_of(&msg, path)?);
                batches.push(block);
            }
            other => return Err(bad(path, format!("an unexpected {other:?} message at offset {p}"))),
        }
        p += meta_len + body;
    }
    let schema = schema.ok_or_else(|| bad(path, "no schema message (empty, or not Arrow IPC)"))?;
    Ok(Index { schema, version, dictionaries, batches, rows })
}

impl IpcFile {
    /// Indexes `path`, in whichever format it is.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| Error::io("data", "cannot read", path, e))?;
        let size = file.metadata().map_err(|e| bad(path, e))?.len();
        let is_file_format = size >= 6 && read_at(&mut file, 0, 6, size, path)? == MAGIC;
        let index = guard(path, || {
            if is_file_format {
                index_file(&mut file, size, path)
            } else {
                index_stream(&mut file, size, path)
            }
        })?;
        Ok(IpcFile { path: path.to_path_buf(), file: Mutex::new(file), index })
    }

    fn block(&self, f: &mut File, b: &Block) -> Result<Buffer> {
        let size = f.metadata().map_err(|e| bad(&self.path, e))?.len();
        let (o, m, l) = extent(b, size, &self.path)?;
        Ok(Buffer::from_vec(read_at(f, o, m + l, size, &self.path)?))
    }
}

impl Blocks for IpcFile {
    fn path(&self) -> &Path {
        &self.path
    }
    fn schema(&self) -> &SchemaRef {
        &self.index.schema
    }
    fn block_rows(&self) -> &[usize] {
        &self.index.rows
    }
    fn chunk_rows(&self) -> usize {
        usize::MAX
    }
    fn read(&self, b: usize, _offset: usize, _n: usize) -> Result<RecordBatch> {
        let ix = &self.index;
        let block = ix.batches.get(b).ok_or_else(|| bad(&self.path, format!("no record batch {b}")))?;
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let mut decoder = FileDecoder::new(ix.schema.clone(), ix.version);
        // the dictionaries in force for this batch: those written before it
        for d in ix.dictionaries.iter().filter(|d| d.offset() < block.offset()) {
            let buf = self.block(&mut f, d)?;
            decoder.read_dictionary(d, &buf).map_err(|e| bad(&self.path, format!("a dictionary batch: {e}")))?;
        }
        let buf = self.block(&mut f, block)?;
        decoder
            .read_record_batch(block, &buf)
            .map_err(|e| bad(&self.path, format!("record batch {b}: {e}")))?
            .ok_or_else(|| bad(&self.path, format!("record batch {b} is empty")))
    }
}

impl TableDataset {
    /// The rows of the Arrow IPC file `path`, in the file format (`.arrow`, `.feather` v2) or
    /// the streaming format (what `datasets`' `save_to_disk` writes).
    pub fn arrow(path: &Path) -> Result<Self> {
        TableDataset::new(path, vec![Box::new(IpcFile::open(path)?)])
    }

    /// The rows of several Arrow IPC files with the same columns, one after another
    /// (`datasets`' shards), named `name` in errors.
    pub(crate) fn arrow_files(name: &Path, files: &[PathBuf]) -> Result<Self> {
        let parts = files.iter().map(|p| Ok(Box::new(IpcFile::open(p)?) as Box<dyn Blocks>)).collect::<Result<_>>()?;
        TableDataset::new(name, parts)
    }
}
