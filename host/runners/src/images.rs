//! Runner images without a registry: a Debian root filesystem made by debootstrap
//! (minbase plus the interpreter), imported into the local engine and tagged.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;
use tokio::process::Command;
use tokio_util::io::ReaderStream;

use crate::config::{ImageBuildConfig, RunnersConfig};
use crate::error::RunnerError;

#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Rebuild even when the image is present.
    pub force: bool,
}

/// What [`build_images`] did for one image.
#[derive(Clone, Debug, PartialEq)]
pub enum ImageOutcome {
    /// Already in the engine; nothing done.
    Present { image: String },
    Built {
        image: String,
        packages: Vec<String>,
        took: Duration,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error("`debootstrap` is not installed; install it with `apt-get install -y debootstrap`")]
    NoDebootstrap,
    #[error("building runner images needs root (debootstrap creates device nodes and chroots)")]
    NotRoot,
    #[error("debootstrap failed for `{image}` (exit {code:?}); its last output:\n{tail}")]
    Debootstrap {
        image: String,
        code: Option<i32>,
        tail: String,
    },
    #[error("importing `{image}` into Docker failed: {source}")]
    Import {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("packing the root filesystem of `{image}` with tar failed: {stderr}")]
    Tar { image: String, stderr: String },
    #[error(
        "importing `{image}` into Docker: the engine accepted the import but has no such image"
    )]
    ImportVanished { image: String },
    #[error("I/O error while {action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
}

/// The images to build: one per distinct configured name, with the packages of every
/// language that uses it (one name for all three gives one image holding all three).
fn recipes(config: &RunnersConfig) -> Vec<(String, Vec<String>)> {
    let wanted = [
        (&config.images.bash, None),
        (&config.images.python, Some("python3")),
        (&config.images.javascript, Some("nodejs")),
        (&config.images.ruby, Some("ruby")),
        (&config.images.lua, Some("lua5.4")),
        (&config.images.lua, Some("lua-cjson")),
    ];
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for (name, pkg) in wanted {
        let entry = match out.iter_mut().position(|(n, _)| n == name) {
            Some(i) => &mut out[i],
            None => {
                out.push((name.clone(), Vec::new()));
                out.last_mut().expect("just pushed")
            }
        };
        if let Some(p) = pkg {
            entry.1.push(p.to_string());
        }
    }
    out
}

/// Builds the runner images named in `config` that the engine does not have yet
/// (all of them with `force`). Idempotent: a second call finds them present and does
/// nothing. `progress` receives one line per step, for the CLI to print.
///
/// The missing images are built at once: a build waits on the mirror and on dpkg far
/// more than on the CPU, so five images take little longer than one. Each keeps its
/// downloads in its own subdirectory of the cache (concurrent debootstraps must not
/// write one file), so a rebuild of an image needs no network.
pub async fn build_images(
    config: &RunnersConfig,
    opts: &BuildOptions,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Vec<ImageOutcome>, ImagesError> {
    let docker = crate::docker::connect_docker(config.docker_host.as_deref()).await?;
    let mut plan = Vec::new();
    for (image, packages) in recipes(config) {
        if !opts.force && docker.inspect_image(&image).await.is_ok() {
            progress(&format!("{image}: present, skipped"));
            plan.push(Err(ImageOutcome::Present { image }));
        } else {
            plan.push(Ok((image, packages)));
        }
    }
    if plan.iter().any(Result::is_ok) {
        check_prerequisites().await?;
    }
    let builds = plan.into_iter().map(|wanted| {
        let docker = &docker;
        async move {
            match wanted {
                Err(present) => Ok(present),
                Ok((image, packages)) => {
                    build_one(docker, &config.build, image, packages, progress).await
                }
            }
        }
    });
    // Every build runs to its end before an error is returned: none is left half done.
    futures_util::future::join_all(builds)
        .await
        .into_iter()
        .collect()
}

/// One image: a root filesystem bootstrapped with `packages`, imported, tagged.
async fn build_one(
    docker: &bollard::Docker,
    build: &ImageBuildConfig,
    image: String,
    packages: Vec<String>,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<ImageOutcome, ImagesError> {
    let t0 = Instant::now();
    progress(&format!(
        "{image}: debootstrap minbase{}{} …",
        if packages.is_empty() { "" } else { " + " },
        packages.join(", ")
    ));
    let rootfs = bootstrap(build, &image, &packages).await?;
    progress(&format!("{image}: importing into Docker …"));
    let imported = import(docker, rootfs.path(), &image, &packages).await;
    drop(rootfs);
    imported?;
    let took = t0.elapsed();
    progress(&format!("{image}: built in {:.0} s", took.as_secs_f64()));
    Ok(ImageOutcome::Built {
        image,
        packages,
        took,
    })
}

async fn check_prerequisites() -> Result<(), ImagesError> {
    if !rustix::process::geteuid().is_root() {
        return Err(ImagesError::NotRoot);
    }
    let found = Command::new("debootstrap")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    match found {
        Ok(_) => Ok(()),
        Err(_) => Err(ImagesError::NoDebootstrap),
    }
}

fn host_suite() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
}

/// The first plain Debian archive URI of the host's apt sources (deb822 or one-line
/// format), so image builds use the same mirror (or proxy) apt does.
fn host_mirror() -> Option<String> {
    let mut texts = Vec::new();
    if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(t);
    }
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<_> = dir.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            let ext = p.extension().and_then(|e| e.to_str());
            if matches!(ext, Some("sources" | "list"))
                && let Ok(t) = std::fs::read_to_string(&p)
            {
                texts.push(t);
            }
        }
    }
    let is_debian = |u: &str| u.trim_end_matches('/').ends_with("/debian");
    for text in texts {
        for line in text.lines().map(str::trim) {
            let uri = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().next()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                rest.split_whitespace().find(|w| !w.starts_with('['))
            } else {
                None
            };
            if let Some(u) = uri.filter(|u| is_debian(u)) {
                return Some(u.to_string());
            }
        }
    }
    None
}

async fn bootstrap(
    build: &ImageBuildConfig,
    image: &str,
    packages: &[String],
) -> Result<tempfile::TempDir, ImagesError> {
    let io = |action: String| move |source| ImagesError::Io { action, source };
    // One download cache per image: concurrent builds never share a file.
    let cache_dir = build.cache_dir.join(image.replace(['/', ':'], "_"));
    for d in [&cache_dir, &build.work_dir] {
        std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
    }
    let rootfs = tempfile::Builder::new()
        .prefix("rootfs-")
        .tempdir_in(&build.work_dir)
        .map_err(io(format!(
            "creating a directory in {}",
            build.work_dir.display()
        )))?;
    let suite = build
        .suite
        .clone()
        .or_else(host_suite)
        .unwrap_or_else(|| "bookworm".into());
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase")
        .arg(format!("--cache-dir={}", cache_dir.display()));
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    cmd.arg(&suite).arg(rootfs.path());
    if let Some(m) = build.mirror.clone().or_else(host_mirror) {
        cmd.arg(m);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(io("running debootstrap".into()))?;
    if !out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        return Err(ImagesError::Debootstrap {
            image: image.into(),
            code: out.status.code(),
            tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    // Package lists and downloaded archives are dead weight in a runner image.
    for d in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        if let Ok(entries) = std::fs::read_dir(rootfs.path().join(d)) {
            for e in entries.flatten() {
                if e.path().is_file() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    Ok(rootfs)
}

/// `repo:tag` → (repo, tag); a colon inside the registry host part is not a tag.
fn split_name(image: &str) -> (&str, &str) {
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => (&image[..i], &image[i + 1..]),
        _ => (image, "latest"),
    }
}

async fn import(
    docker: &bollard::Docker,
    rootfs: &Path,
    image: &str,
    packages: &[String],
) -> Result<(), ImagesError> {
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs)
        .args(["--numeric-owner", "-c", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ImagesError::Io {
            action: "starting tar".into(),
            source,
        })?;
    // Requested as piped just above.
    let stdout = tar.stdout.take().expect("tar stdout is piped");
    let (repo, tag) = split_name(image);
    let changes = vec![
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        "ENV LANG=C.UTF-8".to_string(),
        format!("LABEL heddle.image.packages=\"{}\"", packages.join(",")),
        "CMD [\"bash\"]".to_string(),
    ];
    let opts = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(changes)
        .build();
    let body = bollard::body_try_stream(ReaderStream::new(stdout));
    let mut stream = docker.create_image(Some(opts), Some(body), None);
    let mut failure = None;
    while let Some(item) = stream.next().await {
        if let Err(source) = item {
            failure.get_or_insert(source);
        }
    }
    let status = tar
        .wait_with_output()
        .await
        .map_err(|source| ImagesError::Io {
            action: "waiting for tar".into(),
            source,
        })?;
    if let Some(source) = failure {
        return Err(ImagesError::Import {
            image: image.into(),
            source,
        });
    }
    if !status.status.success() {
        return Err(ImagesError::Tar {
            image: image.into(),
            stderr: String::from_utf8_lossy(&status.stderr).trim().to_string(),
        });
    }
    if docker.inspect_image(image).await.is_err() {
        return Err(ImagesError::ImportVanished {
            image: image.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_split_into_repo_and_tag() {
        assert_eq!(split_name("heddle/python:1"), ("heddle/python", "1"));
        assert_eq!(
            split_name("localhost:5000/x"),
            ("localhost:5000/x", "latest")
        );
        assert_eq!(split_name("bash"), ("bash", "latest"));
    }

    #[test]
    fn one_name_for_all_languages_gives_one_image_with_every_package() {
        let mut c = RunnersConfig::default();
        c.images.python = "all:1".into();
        c.images.javascript = "all:1".into();
        c.images.bash = "all:1".into();
        c.images.ruby = "all:1".into();
        c.images.lua = "all:1".into();
        assert_eq!(
            recipes(&c),
            vec![(
                "all:1".to_string(),
                vec![
                    "python3".into(),
                    "nodejs".into(),
                    "ruby".into(),
                    "lua5.4".into(),
                    "lua-cjson".into()
                ]
            )]
        );
        assert_eq!(recipes(&RunnersConfig::default()).len(), 5);
    }
}
