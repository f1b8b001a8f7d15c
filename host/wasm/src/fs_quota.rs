//! The `wasi:filesystem/types` functions that can grow a file, charging the store's
//! [`WriteQuota`] first.
//!
//! wasmtime-wasi has no quota hook, so the few functions that can grow a file are
//! defined over its own (the linker allows shadowing them): `write` and `set-size`
//! charge the growth they cause before delegating, and the streams `write-via-stream`
//! and `append-via-stream` return are wrapped so every byte written through them
//! (`write`, `blocking-write-and-flush`, `write-zeroes`, `splice` into them) is charged
//! the same way. A charge that does not fit fails with `insufficient-space` (ENOSPC to
//! the guest) and writes nothing.

use std::sync::Arc;

use bytes::Bytes;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView};
use wasmtime_wasi::p2::bindings::filesystem::types::{ErrorCode, Host, HostDescriptor};
use wasmtime_wasi::p2::{
    DynOutputStream, FsResult, OutputStream, Pollable, StreamError, StreamResult,
};

use crate::host_state::State;
use crate::quota::WriteQuota;

/// The `wasi:filesystem/types` instance whose functions are shadowed (the version
/// wasmtime-wasi 48 defines; the linker serves every 0.2.x import from it).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// Bytes a write of `len` bytes at `offset` adds to a file whose end is `end`.
fn growth(end: u64, offset: u64, len: u64) -> u64 {
    offset.saturating_add(len).saturating_sub(end)
}

fn file_len(file: &std::fs::File) -> u64 {
    // A file whose size cannot be read is charged as if empty: never less than the truth.
    file.metadata().map(|m| m.len()).unwrap_or(0)
}

/// The open file behind a descriptor, when the store has a quota and it is a file.
fn quota_file(
    store: &mut StoreContextMut<'_, State>,
    fd: &Resource<Descriptor>,
) -> Option<(Arc<WriteQuota>, Arc<std::fs::File>)> {
    let quota = store.data().quota.clone()?;
    match store.data_mut().filesystem().table.get(fd) {
        Ok(Descriptor::File(f)) => Some((quota, f.file.clone())),
        _ => None,
    }
}

/// wasmtime-wasi's result as the function returns it: an error code for the guest, or
/// a trap for what is not one.
fn lower<T>(
    store: &mut StoreContextMut<'_, State>,
    r: FsResult<T>,
) -> wasmtime::Result<Result<T, ErrorCode>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(e) => Ok(Err(Host::convert_error_code(
            &mut store.data_mut().filesystem(),
            e,
        )?)),
    }
}

/// Shadows the file-growing functions of `wasi:filesystem/types` in `linker` (which
/// must already hold wasmtime-wasi's) with quota-charging ones.
pub(crate) fn add_to_linker(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut i = linker.instance(FILESYSTEM_TYPES)?;
    i.func_wrap_async(
        "[method]descriptor.write",
        |mut store: StoreContextMut<'_, State>,
         (fd, buf, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
            Box::new(async move {
                if let Some((quota, file)) = quota_file(&mut store, &fd)
                    && !quota.charge(growth(file_len(&file), offset, buf.len() as u64))
                {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r = store.data_mut().filesystem().write(fd, buf, offset).await;
                Ok((lower(&mut store, r)?,))
            })
        },
    )?;
    i.func_wrap_async(
        "[method]descriptor.set-size",
        |mut store: StoreContextMut<'_, State>, (fd, size): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                if let Some((quota, file)) = quota_file(&mut store, &fd)
                    && !quota.charge(growth(file_len(&file), size, 0))
                {
                    return Ok((Err(ErrorCode::InsufficientSpace),));
                }
                let r = store.data_mut().filesystem().set_size(fd, size).await;
                Ok((lower(&mut store, r)?,))
            })
        },
    )?;
    i.func_wrap_async(
        "[method]descriptor.write-via-stream",
        |mut store: StoreContextMut<'_, State>, (fd, offset): (Resource<Descriptor>, u64)| {
            Box::new(async move {
                let charged = quota_file(&mut store, &fd);
                let r = store.data_mut().filesystem().write_via_stream(fd, offset);
                let r = lower(&mut store, r)?;
                Ok((wrap(&mut store, r, charged, Some(offset))?,))
            })
        },
    )?;
    i.func_wrap_async(
        "[method]descriptor.append-via-stream",
        |mut store: StoreContextMut<'_, State>, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let charged = quota_file(&mut store, &fd);
                let r = store.data_mut().filesystem().append_via_stream(fd);
                let r = lower(&mut store, r)?;
                Ok((wrap(&mut store, r, charged, None)?,))
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Replaces a file stream wasmtime-wasi made by one that charges the quota.
fn wrap(
    store: &mut StoreContextMut<'_, State>,
    r: Result<Resource<DynOutputStream>, ErrorCode>,
    charged: Option<(Arc<WriteQuota>, Arc<std::fs::File>)>,
    position: Option<u64>,
) -> wasmtime::Result<Result<Resource<DynOutputStream>, ErrorCode>> {
    let (stream, (quota, file)) = match (r, charged) {
        (Ok(stream), Some(c)) => (stream, c),
        (r, _) => return Ok(r),
    };
    let table = store.data_mut().filesystem().table;
    // Not yet handed to the guest: replacing it changes nothing it could observe.
    let inner = table.delete(stream)?;
    let wrapped: DynOutputStream = Box::new(QuotaStream {
        inner,
        quota,
        file,
        position,
        end: 0,
    });
    Ok(Ok(table.push(wrapped)?))
}

/// A file output stream that charges what each write adds to the file.
struct QuotaStream {
    inner: DynOutputStream,
    quota: Arc<WriteQuota>,
    file: Arc<std::fs::File>,
    /// Where the next write lands; `None` for an appending stream (at the end).
    position: Option<u64>,
    /// The end as far as this stream's own writes go (they may not be on disk yet).
    end: u64,
}

impl QuotaStream {
    fn charge(&mut self, len: usize) -> StreamResult<()> {
        let end = self.end.max(file_len(&self.file));
        let at = self.position.unwrap_or(end);
        if !self.quota.charge(growth(end, at, len as u64)) {
            return Err(StreamError::LastOperationFailed(no_space().into()));
        }
        let next = at.saturating_add(len as u64);
        self.end = end.max(next);
        if let Some(p) = &mut self.position {
            *p = next;
        }
        Ok(())
    }
}

fn no_space() -> std::io::Error {
    #[cfg(unix)]
    {
        std::io::Error::from_raw_os_error(libc::ENOSPC)
    }
    #[cfg(not(unix))]
    {
        std::io::Error::new(std::io::ErrorKind::StorageFull, "write quota exceeded")
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for QuotaStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for QuotaStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        self.inner.blocking_write_and_flush(bytes).await
    }

    fn write_zeroes(&mut self, nelem: usize) -> StreamResult<()> {
        self.charge(nelem)?;
        self.inner.write_zeroes(nelem)
    }

    async fn write_ready(&mut self) -> StreamResult<usize> {
        self.inner.write_ready().await
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_what_lies_past_the_end_holes_included() {
        assert_eq!(growth(100, 0, 50), 0, "rewriting costs nothing");
        assert_eq!(growth(100, 90, 20), 10);
        assert_eq!(growth(0, 1 << 40, 1), (1 << 40) + 1, "a hole counts");
        assert_eq!(growth(100, 50, 0), 0, "shrinking costs nothing");
        assert_eq!(growth(0, u64::MAX, u64::MAX), u64::MAX);
    }
}
