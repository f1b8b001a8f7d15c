//! Nodes that try to fill the disk through a read-write grant.

use std::io::{Seek, SeekFrom, Write};

use heddle_sdk::{Error, node};

fn denied(what: &str, path: &str, e: std::io::Error) -> Error {
    let sig = if e.kind() == std::io::ErrorKind::StorageFull {
        "files:no-space"
    } else {
        "files:denied"
    };
    Error::new(format!("{what} {path}: {e}")).signature(sig)
}

node! {
    /// Make a (sparse) file of `size` bytes with one `set-size`.
    #[node("hostile.grow")]
    pub fn grow(path: String, size: i64 = 1i64 << 40) -> ok: bool {
        let f = std::fs::File::create(&path).map_err(|e| denied("create", &path, e))?;
        f.set_len(size as u64).map_err(|e| denied("set-size", &path, e))?;
        Ok(true)
    }
}

node! {
    /// Write `bytes` bytes at `offset` (a hole before them when past the end), in
    /// chunks, through the file's output stream.
    #[node("hostile.write_at")]
    pub fn write_at(path: String, offset: i64 = 1i64 << 40, bytes: i64 = 1i64) -> ok: bool {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| denied("open", &path, e))?;
        f.seek(SeekFrom::Start(offset as u64)).map_err(|e| denied("seek", &path, e))?;
        let chunk = vec![b'x'; 64 << 10];
        let mut left = bytes as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n]).map_err(|e| denied("write", &path, e))?;
            left -= n;
        }
        f.flush().map_err(|e| denied("flush", &path, e))?;
        Ok(true)
    }
}
