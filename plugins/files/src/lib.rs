//! The `files` package: read and write text files inside a directory the operator
//! granted. The package has no authority of its own: without a `[packages.files]` grant
//! the guest sees no filesystem at all, and a read-only grant refuses writes.

use heddle_sdk::{Capability, Decl, Error, Inputs, Node, Outputs};

fn io_error(op: &str, path: &str, e: std::io::Error) -> Error {
    let sig = match e.kind() {
        std::io::ErrorKind::NotFound => "files:not-found",
        std::io::ErrorKind::PermissionDenied => "files:denied",
        _ => "files:io",
    };
    Error::new(format!("{op} `{path}`: {e}")).signature(sig)
}

/// Reads a whole text file.
pub struct ReadText;

impl Node for ReadText {
    const TYPE: &'static str = "files.read_text";

    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .title("Read text file")
            .description("Reads a UTF-8 text file. Paths are as the guest sees them (e.g. /data/notes.txt); only granted directories exist.")
            .input::<String>("path", "File path inside a granted directory")
            .output::<String>("text", "File contents")
            .capability(Capability::files_read("/data", "reads the file named by `path`"))
            .retry_safe()
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        let path: String = inputs.get("path")?;
        let text = std::fs::read_to_string(&path).map_err(|e| io_error("reading", &path, e))?;
        Ok(Outputs::one("text", text))
    }
}

/// Writes (or appends to) a text file.
pub struct WriteText;

impl Node for WriteText {
    const TYPE: &'static str = "files.write_text";

    fn declare() -> Decl {
        Decl::new(Self::TYPE)
            .title("Write text file")
            .description("Writes `text` to `path` (replacing it, or appending when `append` is true). Needs a read-write grant.")
            .input::<String>("path", "File path inside a granted directory")
            .input::<String>("text", "Text to write")
            .input_default::<bool>("append", false, "Append instead of replacing")
            .output::<String>("path", "The path written")
            .output::<i64>("bytes", "Bytes written")
            .capability(Capability::files_write("/data", "writes the file named by `path`"))
    }

    fn run(inputs: &mut Inputs) -> Result<Outputs, Error> {
        use std::io::Write;
        let path: String = inputs.get("path")?;
        let text: String = inputs.get("text")?;
        let append: bool = inputs.get_or("append", false)?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&path)
            .map_err(|e| io_error("opening", &path, e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| io_error("writing", &path, e))?;
        heddle_sdk::record_asset(&format!("file:{path}"));
        Ok(Outputs::new()
            .with("path", path)
            .with("bytes", text.len() as i64))
    }
}

heddle_sdk::export_nodes!(ReadText, WriteText);
