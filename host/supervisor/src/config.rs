//! Endpoint, model, key and pricing. A supervisor that cannot start refuses the run with
//! the reason instead of letting it run unsupervised.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Price of one model in USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

impl ModelPrice {
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> f64 {
        (input_tokens as f64 * self.input_per_mtok + output_tokens as f64 * self.output_per_mtok)
            / 1_000_000.0
    }
}

/// Model → price. The built-in entries are list prices of common OpenAI models at the
/// time of writing; operators override or add entries (a local server's model, a newer
/// price) in config. A model with no entry does not run: without a price the cost
/// ceiling cannot be enforced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PricingTable(pub BTreeMap<String, ModelPrice>);

impl PricingTable {
    pub fn builtin() -> Self {
        let p = |i, o| ModelPrice {
            input_per_mtok: i,
            output_per_mtok: o,
        };
        PricingTable(
            [
                ("gpt-4o", p(2.50, 10.00)),
                ("gpt-4o-mini", p(0.15, 0.60)),
                ("gpt-4.1", p(2.00, 8.00)),
                ("gpt-4.1-mini", p(0.40, 1.60)),
                ("gpt-4.1-nano", p(0.10, 0.40)),
                ("o4-mini", p(1.10, 4.40)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        )
    }

    pub fn insert(&mut self, model: impl Into<String>, price: ModelPrice) {
        self.0.insert(model.into(), price);
    }

    pub fn price(&self, model: &str) -> Option<ModelPrice> {
        self.0.get(model).copied()
    }
}

/// `[supervisor]` in `heddle.toml`: what an operator sets once instead of exporting
/// variables. Every key is optional. The environment overrides the file and a
/// command-line flag overrides both ([`LlmConfig::resolve`]). The API key is never read
/// from the file: a config file is shared and checked in, a key must not be.
///
/// ```toml
/// [supervisor]
/// endpoint = "http://127.0.0.1:8080/v1"
/// model = "my-local-model"
/// cost_cap_usd = 0.25
/// max_output_tokens = 1024
///
/// [supervisor.pricing."my-local-model"]   # USD per million tokens
/// input_per_mtok = 0.10
/// output_per_mtok = 0.40
/// ```
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisorSection {
    pub endpoint: Option<String>,
    pub model: Option<String>,
    pub cost_cap_usd: Option<f64>,
    pub max_output_tokens: Option<u32>,
    /// Prices per model, over the built-in table (a model listed here replaces its
    /// built-in price).
    #[serde(default)]
    pub pricing: BTreeMap<String, ModelPrice>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "no supervisor endpoint: set HEDDLE_SUPERVISOR_ENDPOINT (an OpenAI-compatible base URL such as https://api.openai.com/v1) or `endpoint` in the [supervisor] section of heddle.toml"
    )]
    NoEndpoint,
    #[error("supervisor endpoint `{0}` is not an http(s) URL")]
    BadEndpoint(String),
    #[error(
        "no supervisor model: pass --supervisor-model, set HEDDLE_SUPERVISOR_MODEL, or set `model` in the [supervisor] section of heddle.toml"
    )]
    NoModel,
    #[error(
        "no pricing for supervisor model `{0}`: the cost ceiling cannot be enforced without it; add a price: HEDDLE_SUPERVISOR_PRICE=\"<input $/Mtok>,<output $/Mtok>\", or in heddle.toml [supervisor.pricing.\"{0}\"] with input_per_mtok and output_per_mtok"
    )]
    NoPricing(String),
    #[error("bad {what}: {why}")]
    Invalid { what: &'static str, why: String },
}

#[derive(Clone, Debug)]
pub struct LlmConfig {
    /// Base URL; requests go to `{endpoint}/chat/completions`.
    pub endpoint: String,
    pub model: String,
    /// Sent as a bearer token; registered as a run secret so it is masked everywhere.
    pub api_key: Option<String>,
    /// Output-token limit on every call; also the output side of each reservation.
    pub max_output_tokens: u32,
    /// Ceiling on what this supervisor may spend in one run.
    pub cost_cap_usd: f64,
    /// Model turns per decision.
    pub max_turns: u32,
    /// Limit on one HTTP request (the kernel's decision timeout bounds the whole).
    pub request_timeout: Duration,
    pub pricing: PricingTable,
}

impl LlmConfig {
    pub fn new(endpoint: impl Into<String>, model: impl Into<String>) -> Self {
        LlmConfig {
            endpoint: endpoint.into(),
            model: model.into(),
            api_key: None,
            max_output_tokens: 2048,
            cost_cap_usd: 0.50,
            max_turns: 6,
            request_timeout: Duration::from_secs(60),
            pricing: PricingTable::builtin(),
        }
    }

    /// The configuration from the process environment over `file` (the `[supervisor]`
    /// section, when the config has one); see [`LlmConfig::resolve`].
    pub fn from_env(
        model: Option<&str>,
        file: Option<&SupervisorSection>,
    ) -> Result<Self, ConfigError> {
        Self::resolve(model, file, |k| std::env::var(k).ok())
    }

    /// Each setting from the first place that has it: `model` (the CLI's
    /// `--supervisor-model`; the cost cap's flag is applied by the caller), then the
    /// environment, then `file`, then the default. The variables are
    /// `HEDDLE_SUPERVISOR_ENDPOINT` (else `OPENAI_BASE_URL`), `HEDDLE_SUPERVISOR_MODEL`,
    /// `HEDDLE_SUPERVISOR_API_KEY` (else `OPENAI_API_KEY`; the key only ever comes from
    /// the environment), `HEDDLE_SUPERVISOR_PRICE` (`in,out` USD per million tokens for
    /// the chosen model, over the file's `pricing` and the built-in table),
    /// `HEDDLE_SUPERVISOR_MAX_OUTPUT_TOKENS` and `HEDDLE_SUPERVISOR_COST_CAP`. `var` is
    /// the variable source (testable without touching the process environment).
    pub fn resolve(
        model: Option<&str>,
        file: Option<&SupervisorSection>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let get = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let default = SupervisorSection::default();
        let file = file.unwrap_or(&default);
        let from_file = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
        let endpoint = get("HEDDLE_SUPERVISOR_ENDPOINT")
            .or_else(|| get("OPENAI_BASE_URL"))
            .or_else(|| from_file(&file.endpoint))
            .ok_or(ConfigError::NoEndpoint)?;
        let model = model
            .map(str::to_string)
            .or_else(|| get("HEDDLE_SUPERVISOR_MODEL"))
            .or_else(|| from_file(&file.model))
            .ok_or(ConfigError::NoModel)?;
        let mut cfg = LlmConfig::new(endpoint, model);
        for (m, price) in &file.pricing {
            cfg.pricing.insert(m.clone(), *price);
        }
        if let Some(t) = file.max_output_tokens {
            cfg.max_output_tokens = t;
        }
        if let Some(c) = file.cost_cap_usd {
            cfg.cost_cap_usd = c;
        }
        cfg.api_key = get("HEDDLE_SUPERVISOR_API_KEY").or_else(|| get("OPENAI_API_KEY"));
        if let Some(p) = get("HEDDLE_SUPERVISOR_PRICE") {
            let price = parse_price(&p).ok_or_else(|| ConfigError::Invalid {
                what: "HEDDLE_SUPERVISOR_PRICE",
                why: format!("`{p}` is not `<input $/Mtok>,<output $/Mtok>`"),
            })?;
            cfg.pricing.insert(cfg.model.clone(), price);
        }
        if let Some(t) = get("HEDDLE_SUPERVISOR_MAX_OUTPUT_TOKENS") {
            cfg.max_output_tokens = t.trim().parse().map_err(|_| ConfigError::Invalid {
                what: "HEDDLE_SUPERVISOR_MAX_OUTPUT_TOKENS",
                why: format!("`{t}` is not a whole number"),
            })?;
        }
        if let Some(c) = get("HEDDLE_SUPERVISOR_COST_CAP") {
            cfg.cost_cap_usd = c.trim().parse().map_err(|_| ConfigError::Invalid {
                what: "HEDDLE_SUPERVISOR_COST_CAP",
                why: format!("`{c}` is not a number of USD"),
            })?;
        }
        Ok(cfg)
    }

    /// Everything a run needs checked before it starts.
    pub fn validate(&self) -> Result<ModelPrice, ConfigError> {
        let e = self.endpoint.trim();
        if e.is_empty() {
            return Err(ConfigError::NoEndpoint);
        }
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            return Err(ConfigError::BadEndpoint(e.to_string()));
        }
        if self.model.trim().is_empty() {
            return Err(ConfigError::NoModel);
        }
        if self.max_output_tokens == 0 {
            return Err(ConfigError::Invalid {
                what: "max output tokens",
                why: "must be at least 1".into(),
            });
        }
        if !(self.cost_cap_usd.is_finite() && self.cost_cap_usd >= 0.0) {
            return Err(ConfigError::Invalid {
                what: "cost cap",
                why: format!("{} is not a non-negative amount", self.cost_cap_usd),
            });
        }
        if self.max_turns == 0 {
            return Err(ConfigError::Invalid {
                what: "max turns",
                why: "must be at least 1".into(),
            });
        }
        let price = self
            .pricing
            .price(&self.model)
            .ok_or_else(|| ConfigError::NoPricing(self.model.clone()))?;
        if !(price.input_per_mtok >= 0.0 && price.output_per_mtok >= 0.0) {
            return Err(ConfigError::Invalid {
                what: "model price",
                why: "prices must be non-negative".into(),
            });
        }
        Ok(price)
    }

    pub fn url(&self) -> String {
        format!(
            "{}/chat/completions",
            self.endpoint.trim().trim_end_matches('/')
        )
    }
}

fn parse_price(s: &str) -> Option<ModelPrice> {
    let (i, o) = s.split_once(',')?;
    Some(ModelPrice {
        input_per_mtok: i.trim().parse().ok()?,
        output_per_mtok: o.trim().parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn refuses_without_endpoint_model_or_pricing() {
        assert_eq!(
            LlmConfig::resolve(None, None, env(&[])).unwrap_err(),
            ConfigError::NoEndpoint
        );
        assert_eq!(
            LlmConfig::resolve(
                None,
                None,
                env(&[("HEDDLE_SUPERVISOR_ENDPOINT", "http://x")])
            )
            .unwrap_err(),
            ConfigError::NoModel
        );
        let c = LlmConfig::resolve(
            Some("my-local-model"),
            None,
            env(&[("HEDDLE_SUPERVISOR_ENDPOINT", "http://x")]),
        )
        .unwrap();
        assert_eq!(
            c.validate().unwrap_err(),
            ConfigError::NoPricing("my-local-model".into())
        );
        let c = LlmConfig::resolve(
            Some("my-local-model"),
            None,
            env(&[
                ("HEDDLE_SUPERVISOR_ENDPOINT", "http://x/v1/"),
                ("HEDDLE_SUPERVISOR_PRICE", "1, 2"),
                ("OPENAI_API_KEY", "k"),
            ]),
        )
        .unwrap();
        assert_eq!(c.validate().unwrap().output_per_mtok, 2.0);
        assert_eq!(c.url(), "http://x/v1/chat/completions");
        assert_eq!(c.api_key.as_deref(), Some("k"));
        let mut c = LlmConfig::new("ftp://x", "gpt-4o-mini");
        assert!(matches!(c.validate(), Err(ConfigError::BadEndpoint(_))));
        c.endpoint = "https://x".into();
        assert!(c.validate().is_ok());
    }

    #[test]
    fn the_file_section_configures_and_the_environment_and_flag_override_it() {
        // As `[supervisor]` deserializes (the CLI reads the TOML into this type).
        let file: SupervisorSection = serde_json::from_value(serde_json::json!({
            "endpoint": "http://file/v1",
            "model": "file-model",
            "cost_cap_usd": 0.25,
            "max_output_tokens": 100,
            "pricing": {
                "file-model": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                "env-model": {"input_per_mtok": 3.0, "output_per_mtok": 4.0},
            },
        }))
        .unwrap();
        assert!(
            serde_json::from_value::<SupervisorSection>(serde_json::json!({"api_key": "k"}))
                .is_err(),
            "a key is never read from the file"
        );
        let c = LlmConfig::resolve(None, Some(&file), env(&[])).unwrap();
        assert_eq!(
            (
                c.endpoint.as_str(),
                c.model.as_str(),
                c.cost_cap_usd,
                c.max_output_tokens
            ),
            ("http://file/v1", "file-model", 0.25, 100)
        );
        assert_eq!(c.validate().unwrap().output_per_mtok, 2.0);
        // The environment over the file, the flag over both.
        let vars = [
            ("HEDDLE_SUPERVISOR_ENDPOINT", "http://env/v1"),
            ("HEDDLE_SUPERVISOR_MODEL", "env-model"),
            ("HEDDLE_SUPERVISOR_COST_CAP", "0.1"),
        ];
        let c = LlmConfig::resolve(None, Some(&file), env(&vars)).unwrap();
        assert_eq!(
            (c.endpoint.as_str(), c.model.as_str(), c.cost_cap_usd),
            ("http://env/v1", "env-model", 0.1)
        );
        assert_eq!(c.validate().unwrap().input_per_mtok, 3.0);
        let c = LlmConfig::resolve(Some("gpt-4o-mini"), Some(&file), env(&vars)).unwrap();
        assert_eq!(c.model, "gpt-4o-mini");
        // A model without a price says where one goes.
        let c = LlmConfig::resolve(Some("unpriced"), Some(&file), env(&[])).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("[supervisor.pricing.\"unpriced\"]")
                && e.contains("HEDDLE_SUPERVISOR_PRICE"),
            "{e}"
        );
    }
}
