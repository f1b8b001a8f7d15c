//! The bearer token every request must carry: generated on the first start, kept in a
//! file only its owner can read, printed once, compared in constant time.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq as _;

/// The token file, beside the run store it guards.
pub fn path_for(store: &Path) -> PathBuf {
    let dir = store.parent().filter(|d| !d.as_os_str().is_empty());
    dir.unwrap_or(Path::new(".")).join("serve.token")
}

/// Why the token file cannot be used; the server does not start.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// It could not be read or made.
    #[error("{}: cannot read or create the API token file", path.display())]
    Io {
        /// The token file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Others can read it.
    #[error(
        "{}: the API token file can be read by others (mode {mode:o}); make it owner-only (chmod 600) or remove it to get a new token",
        path.display()
    )]
    Exposed {
        /// The token file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It holds fewer hex digits than a generated token: a guessable secret (a
    /// hand-written `1234`) would guard the API.
    #[error(
        "{}: the API token file holds {len} hex digits, fewer than the {TOKEN_HEX_DIGITS} of a generated token; remove it to get a new token",
        path.display()
    )]
    Short {
        /// The token file.
        path: PathBuf,
        /// How many digits it holds.
        len: usize,
    },
    /// It holds something else than a token.
    #[error("{}: the API token file is empty or not one line of hex; remove it to get a new token", path.display())]
    Malformed {
        /// The token file.
        path: PathBuf,
    },
}

impl TokenError {
    /// Whether the file is there but unusable as it is (a mistake the operator
    /// corrects), rather than unreadable.
    pub fn is_bad_file(&self) -> bool {
        !matches!(self, TokenError::Io { .. })
    }
}

/// Random bytes in a generated token.
const TOKEN_BYTES: usize = 32;

/// Hex digits in a generated token; a token file with fewer is refused.
pub const TOKEN_HEX_DIGITS: usize = TOKEN_BYTES * 2;

/// The bearer token every request must carry (its text is secret: it is never logged).
#[derive(Clone)]
pub struct Token(String);

/// Loads the token at `path`, or makes one there (and the directory it is in). The bool
/// says it is new (the caller prints it that one time). Made whole before it appears
/// under its name, so hosts starting together (several on one database) all read the
/// one that won, never a file half written.
pub fn load_or_create(path: &Path) -> Result<(Token, bool), TokenError> {
    let io = |source| TokenError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !path.exists() {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut r| r.read_exact(&mut bytes))
            .map_err(io)?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let tmp = path.with_extension(format!("token.{}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(format!("{text}\n").as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match written {
            Ok(()) => return Ok((Token(text), true)),
            // Another process made it first: that one is the token.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e)),
        }
    }
    let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::Malformed {
            path: path.to_path_buf(),
        });
    }
    if text.len() < TOKEN_HEX_DIGITS {
        return Err(TokenError::Short {
            path: path.to_path_buf(),
            len: text.len(),
        });
    }
    Ok((Token(text.to_string()), false))
}

impl Token {
    /// Its text, to show the operator once.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is the token, in time that does not depend on where they
    /// first differ (only on their lengths, which are not secret).
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}
