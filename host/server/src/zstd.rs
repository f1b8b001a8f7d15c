//! A zstd stream assembled from frames compressed once for every subscriber.
//!
//! A zstd stream is one or more frames, each complete on its own (RFC 8878, 3.1): a
//! piece of event text compressed into its own frame refers to no byte outside it, so
//! frames concatenate in any order and from any starting point into one valid stream,
//! and a client decodes each as soon as it has it. Unlike gzip there is no per-stream
//! header or trailer: a connection sends the shared frames and nothing of its own.

use std::sync::LazyLock;

use axum::body::Bytes;

/// The level the event text is compressed at. On a run's event text (12.4 MB in 3 MB
/// and 0.3 MB pieces, as a busy and a quiet run batch it): level 1 compresses it 43x and
/// 39x, 3 40x and 37x, 6 37x and 35x (gzip at the level `gzip.rs` uses: 17x), and 1 is
/// the fastest. Each frame's window is at most 512 KiB at this level, well inside the
/// 8 MiB a browser accepts (RFC 9659).
const LEVEL: i32 = 1;

/// `text` as one frame, with its checksum (so a strict client checks every frame).
pub fn frame(text: &[u8]) -> Bytes {
    // Both fail only when the library cannot allocate its context: an invariant here,
    // as for any allocation.
    let mut c = zstd::bulk::Compressor::new(LEVEL).expect("a zstd context");
    c.include_checksum(true).expect("a valid zstd parameter");
    Bytes::from(c.compress(text).expect("zstd into memory"))
}

/// The keep-alive comment, compressed once for every connection.
pub static KEEP_ALIVE: LazyLock<Bytes> = LazyLock::new(|| frame(b":\n\n"));

#[cfg(test)]
mod tests {
    use super::*;

    fn texts() -> Vec<Vec<u8>> {
        (0..5)
            .map(|i| format!("id: {i}\nevent: x\ndata: {{\"n\":{i}}}\n\n").repeat(50 * i + 1))
            .map(String::into_bytes)
            .collect()
    }

    #[test]
    fn frames_concatenate_into_one_stream_from_any_start() {
        let texts = texts();
        let frames: Vec<Bytes> = texts.iter().map(|t| frame(t)).collect();
        for start in 0..frames.len() {
            let mut bytes = frames[start..].concat();
            bytes.extend_from_slice(&KEEP_ALIVE);
            let mut want = texts[start..].concat();
            want.extend_from_slice(b":\n\n");
            assert_eq!(zstd::stream::decode_all(&bytes[..]).unwrap(), want);
        }
    }

    #[test]
    fn a_damaged_frame_is_caught_by_its_checksum() {
        let text = texts().concat();
        let mut bytes = frame(&text).to_vec();
        // The last four bytes are the checksum: flip one bit of the content's.
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        assert!(zstd::stream::decode_all(&bytes[..]).is_err());
    }
}
