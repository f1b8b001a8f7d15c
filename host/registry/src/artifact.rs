//! The CNCF TAG Runtime "Wasm OCI artifact" layout, as `wkg oci push` writes it: an OCI
//! image manifest whose config has media type `application/vnd.wasm.config.v0+json`
//! (`architecture = "wasm"`, `os = "wasip2"`, the layer digests, the component's world)
//! and exactly one `application/wasm` layer holding the component bytes, so the layer
//! digest is the component's sha256. Heddle adds one config field, `heddlePackage`,
//! holding the package manifest (`heddle-package.toml`) byte for byte, and, for a package
//! whose manifest lists `graphs`, one more, `heddleGraphs`, holding each graph document's
//! text by its path. A component pushed by another tool has neither, and its manifest is
//! made from the annotations.
//!
//! The graphs travel in the config rather than as layers of their own: oci-wasm (what
//! `wkg oci pull` uses) refuses an artifact with more than one layer, so extra layers
//! would make every package providing graphs unpullable by wkg. The config is fetched
//! whole and checked against its digest like any blob, and a signature covers it
//! through the manifest's digest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::client::{DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST};
use crate::error::RegistryError;
use crate::reference::valid_digest;

pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
pub const ARCHITECTURE: &str = "wasm";
pub const COMPONENT_OS: &str = "wasip2";

pub const ANNOTATION_VERSION: &str = "org.opencontainers.image.version";
pub const ANNOTATION_DESCRIPTION: &str = "org.opencontainers.image.description";
pub const ANNOTATION_SOURCE: &str = "org.opencontainers.image.source";
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";

/// An OCI content descriptor (field order as oci-client, which wkg uses, writes it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// An OCI image manifest (field order as oci-client writes it).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The component's world, as oci-wasm records it.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct ComponentWorld {
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    pub target: Option<String>,
}

/// The config blob (oci-wasm's `WasmConfig` plus `heddlePackage`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    #[serde(default)]
    pub created: Option<String>,
    #[serde(default)]
    pub author: Option<String>,
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub layer_digests: Vec<String>,
    #[serde(default)]
    pub component: Option<ComponentWorld>,
    /// The Heddle package manifest, byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heddle_package: Option<String>,
    /// The graph documents the manifest lists (`graphs`), each's exact text by its path
    /// inside the package. Absent when it lists none, so such a package's config is
    /// what it was before graphs existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub heddle_graphs: BTreeMap<String, String>,
}

/// A pulled manifest that passed the layout checks.
#[derive(Debug)]
pub struct Checked {
    pub manifest: ImageManifest,
    pub layer: Descriptor,
}

/// Checks a pulled manifest's layout: one image manifest, the Wasm config media type,
/// exactly one `application/wasm` layer no larger than `max_layer`.
pub fn check_manifest(
    reference: &str,
    bytes: &[u8],
    max_layer: u64,
) -> Result<Checked, RegistryError> {
    let not_wasm = |message: String| RegistryError::NotWasm {
        reference: reference.to_string(),
        message,
    };
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        schema_version: Option<u32>,
        media_type: Option<String>,
    }
    let head: Head = serde_json::from_slice(bytes)
        .map_err(|e| not_wasm(format!("its manifest is not JSON ({e})")))?;
    if let Some(mt) = head.media_type.as_deref()
        && (mt == OCI_INDEX || mt == DOCKER_LIST)
    {
        return Err(not_wasm(format!(
            "it is an image index ({mt}), a list of platform images, not a Wasm artifact"
        )));
    }
    if head.schema_version != Some(2) {
        return Err(not_wasm(format!(
            "manifest schemaVersion {:?}, expected 2",
            head.schema_version
        )));
    }
    if let Some(mt) = head.media_type.as_deref()
        && mt != OCI_MANIFEST
        && mt != DOCKER_MANIFEST
    {
        return Err(not_wasm(format!("manifest media type `{mt}`")));
    }
    let manifest: ImageManifest = serde_json::from_slice(bytes)
        .map_err(|e| not_wasm(format!("malformed image manifest ({e})")))?;
    if manifest.config.media_type != CONFIG_MEDIA_TYPE {
        return Err(not_wasm(format!(
            "config media type `{}`, expected `{CONFIG_MEDIA_TYPE}`",
            manifest.config.media_type
        )));
    }
    let layer = match manifest.layers.as_slice() {
        [one] => one.clone(),
        many => {
            return Err(not_wasm(format!(
                "{} layers; a Wasm artifact has exactly one `{LAYER_MEDIA_TYPE}` layer",
                many.len()
            )));
        }
    };
    if layer.media_type != LAYER_MEDIA_TYPE {
        return Err(not_wasm(format!(
            "layer media type `{}`, expected `{LAYER_MEDIA_TYPE}`",
            layer.media_type
        )));
    }
    for (what, d) in [
        ("config", &manifest.config.digest),
        ("layer", &layer.digest),
    ] {
        if !valid_digest(d) {
            return Err(not_wasm(format!(
                "{what} digest `{d}` is not a sha256 digest"
            )));
        }
    }
    if layer.size > max_layer {
        return Err(RegistryError::TooLarge {
            reference: reference.to_string(),
            what: format!("component ({} bytes)", layer.size),
            limit: max_layer,
            hint: "; raise [wasm] max_component_bytes if it is expected",
        });
    }
    Ok(Checked { manifest, layer })
}

/// Checks a pulled config: a component (`wasip2`) of the layer the manifest names.
pub fn check_config(
    reference: &str,
    bytes: &[u8],
    layer: &Descriptor,
) -> Result<WasmConfig, RegistryError> {
    let not_wasm = |message: String| RegistryError::NotWasm {
        reference: reference.to_string(),
        message,
    };
    let c: WasmConfig = serde_json::from_slice(bytes)
        .map_err(|e| not_wasm(format!("malformed Wasm config ({e})")))?;
    if c.architecture != ARCHITECTURE {
        return Err(not_wasm(format!(
            "config architecture `{}`, expected `{ARCHITECTURE}`",
            c.architecture
        )));
    }
    if c.os != COMPONENT_OS {
        return Err(not_wasm(format!(
            "config os `{}`, expected `{COMPONENT_OS}` (a component; `wasip1` is a core module)",
            c.os
        )));
    }
    if !c.layer_digests.is_empty() && c.layer_digests != [layer.digest.clone()] {
        return Err(not_wasm(format!(
            "config layerDigests {:?} do not name the manifest's layer {}",
            c.layer_digests, layer.digest
        )));
    }
    Ok(c)
}

/// The config and manifest of a package being pushed: `(config bytes, manifest bytes)`.
/// `graphs`: the graph documents the package provides, by path.
pub fn build(
    component: &[u8],
    world: ComponentWorld,
    manifest_text: &str,
    graphs: BTreeMap<String, String>,
    title: &str,
    annotations: BTreeMap<String, String>,
    created: String,
) -> (Vec<u8>, Vec<u8>) {
    let layer_digest = crate::client::sha256_digest(component);
    let config = WasmConfig {
        created: Some(created),
        author: None,
        architecture: ARCHITECTURE.into(),
        os: COMPONENT_OS.into(),
        layer_digests: vec![layer_digest.clone()],
        component: Some(world),
        heddle_package: Some(manifest_text.to_string()),
        heddle_graphs: graphs,
    };
    // Invariant: plain structs of strings serialize.
    let config_bytes = serde_json::to_vec(&config).expect("config serializes");
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        config: Descriptor {
            media_type: CONFIG_MEDIA_TYPE.into(),
            digest: crate::client::sha256_digest(&config_bytes),
            size: config_bytes.len() as u64,
            annotations: None,
        },
        layers: vec![Descriptor {
            media_type: LAYER_MEDIA_TYPE.into(),
            digest: layer_digest,
            size: component.len() as u64,
            annotations: Some(BTreeMap::from([(ANNOTATION_TITLE.into(), title.into())])),
        }],
        annotations: Some(annotations),
    };
    let manifest_bytes = serde_json::to_vec(&manifest).expect("manifest serializes");
    (config_bytes, manifest_bytes)
}

/// RFC 3339 UTC time of `SOURCE_DATE_EPOCH` when set (reproducible pushes), else now.
pub fn created_now() -> String {
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        });
    rfc3339(secs)
}

fn rfc3339(secs: u64) -> String {
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn a_built_artifact_passes_its_own_checks_and_others_do_not() {
        let (config, manifest) = build(
            b"\0asm component",
            ComponentWorld::default(),
            "name = \"x\"\n",
            BTreeMap::new(),
            "x.wasm",
            BTreeMap::new(),
            rfc3339(0),
        );
        let c = check_manifest("r", &manifest, 1 << 20).unwrap();
        assert_eq!(
            c.layer.digest,
            crate::client::sha256_digest(b"\0asm component")
        );
        check_config("r", &config, &c.layer).unwrap();
        let e = check_manifest("r", &manifest, 4).unwrap_err().to_string();
        assert!(e.contains("larger than 4 bytes"), "{e}");
        let two = String::from_utf8(manifest.clone()).unwrap().replace(
            "\"layers\":[",
            &format!("\"layers\":[{},", serde_json::to_string(&c.layer).unwrap()),
        );
        let e = check_manifest("r", two.as_bytes(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 layers"), "{e}");
    }
}
