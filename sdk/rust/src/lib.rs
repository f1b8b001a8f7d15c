//! Write Heddle nodes in Rust.
//!
//! A node is a function with typed inputs and outputs:
//!
//! ```ignore
//! heddle_sdk::node! {
//!     /// Concatenate two strings.
//!     #[node("demo.concat", retry_safe)]
//!     pub fn concat(a: String, b: String, sep: String = "") -> text: String {
//!         Ok(format!("{a}{sep}{b}"))
//!     }
//! }
//! heddle_sdk::export_nodes!(concat);
//! ```
//!
//! Port types come from the Rust types ([`PortValue`]); `Option<T>` makes an input
//! optional; `= expr` gives a default. For streaming or anything the macro does not
//! cover, implement [`Node`] by hand. The package is built with
//! `cargo build --release --target wasm32-wasip2`; see the README.

use std::collections::BTreeMap;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "node-package",
        // The newest contract: 0.2 (controlled nodes and controllers). The host loads
        // packages built against 0.1 beside these.
        path: "../../wit/v0.2",
        pub_export_macro: true,
        export_macro_name: "__heddle_export_world",
        default_bindings_module: "heddle_sdk::bindings",
    });
}

use bindings::heddle::node::host;
use bindings::heddle::node::types as wire;

#[cfg(feature = "http")]
pub mod http;
mod signature;
mod value;
pub use signature::check as check_signature;
pub use value::Value;

// ----- port types -----------------------------------------------------------------

/// A Rust type that can sit on a port: it names its port type and converts from and to
/// [`Value`].
pub trait PortValue: Sized {
    /// The port type string (`str`, `int`, `list[float]`, ...).
    fn port_type() -> String;
    /// Whether an input of this type must be connected or configured.
    fn required() -> bool {
        true
    }
    fn from_value(v: Value) -> Result<Self, String>;
    fn into_value(self) -> Value;
    /// The value when the input is absent (only optional types have one).
    fn absent() -> Option<Self> {
        None
    }
}

macro_rules! simple_port {
    ($t:ty, $name:literal, $pat:pat => $out:expr, $v:ident => $into:expr) => {
        impl PortValue for $t {
            fn port_type() -> String {
                $name.into()
            }
            fn from_value(v: Value) -> Result<Self, String> {
                match v {
                    $pat => Ok($out),
                    other => Err(format!("expected {}, got {}", $name, other.kind())),
                }
            }
            fn into_value(self) -> Value {
                let $v = self;
                $into
            }
        }
    };
}

simple_port!(String, "str", Value::Str(s) => s, v => Value::Str(v));
simple_port!(i64, "int", Value::Int(i) => i, v => Value::Int(v));
simple_port!(bool, "bool", Value::Bool(b) => b, v => Value::Bool(v));

impl PortValue for f64 {
    fn port_type() -> String {
        "float".into()
    }
    fn from_value(v: Value) -> Result<Self, String> {
        v.as_f64()
            .ok_or_else(|| format!("expected float, got {}", v.kind()))
    }
    fn into_value(self) -> Value {
        Value::Float(self)
    }
}

impl PortValue for Value {
    fn port_type() -> String {
        "any".into()
    }
    fn from_value(v: Value) -> Result<Self, String> {
        Ok(v)
    }
    fn into_value(self) -> Value {
        self
    }
}

/// Raw bytes on a `bytes` port.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bytes(pub Vec<u8>);

impl PortValue for Bytes {
    fn port_type() -> String {
        "bytes".into()
    }
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Bytes(b) => Ok(Bytes(b)),
            other => Err(format!("expected bytes, got {}", other.kind())),
        }
    }
    fn into_value(self) -> Value {
        Value::Bytes(self.0)
    }
}

/// Any JSON value on a `json` port.
impl PortValue for serde_json::Value {
    fn port_type() -> String {
        "json".into()
    }
    fn from_value(v: Value) -> Result<Self, String> {
        Ok(v.to_json())
    }
    fn into_value(self) -> Value {
        Value::from_json(self)
    }
}

/// A JSON object on an `object` port.
impl PortValue for BTreeMap<String, Value> {
    fn port_type() -> String {
        "object".into()
    }
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Object(m) => Ok(m),
            other => Err(format!("expected object, got {}", other.kind())),
        }
    }
    fn into_value(self) -> Value {
        Value::Object(self)
    }
}

impl<T: PortValue> PortValue for Vec<T> {
    fn port_type() -> String {
        format!("list[{}]", T::port_type())
    }
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::List(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, x)| T::from_value(x).map_err(|e| format!("item {i}: {e}")))
                .collect(),
            other => Err(format!("expected a list, got {}", other.kind())),
        }
    }
    fn into_value(self) -> Value {
        Value::List(self.into_iter().map(T::into_value).collect())
    }
}

impl<T: PortValue> PortValue for Option<T> {
    fn port_type() -> String {
        T::port_type()
    }
    fn required() -> bool {
        false
    }
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
    fn into_value(self) -> Value {
        self.map(T::into_value).unwrap_or(Value::Null)
    }
    fn absent() -> Option<Self> {
        Some(None)
    }
}

// ----- declarations ---------------------------------------------------------------

/// How an output's values relate to the invocation's lineage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Correlation {
    /// One value per invocation, same lineage (the usual case).
    Single,
    /// Every emitted value is a new item (fan-out): downstream runs once per item.
    Iteration,
    /// Many values for the same lineage.
    Chunk,
    /// Fan-in (streaming-input nodes only).
    Aggregate,
}

/// What a node asks the operator for.
#[derive(Clone, Debug)]
pub struct Capability {
    kind: wire::CapabilityKind,
    target: String,
    reason: String,
}

impl Capability {
    pub fn files_read(dir: &str, reason: &str) -> Self {
        Self::new(wire::CapabilityKind::FilesRead, dir, reason)
    }
    pub fn files_write(dir: &str, reason: &str) -> Self {
        Self::new(wire::CapabilityKind::FilesWrite, dir, reason)
    }
    pub fn env(name: &str, reason: &str) -> Self {
        Self::new(wire::CapabilityKind::Env, name, reason)
    }
    pub fn secret(name: &str, reason: &str) -> Self {
        Self::new(wire::CapabilityKind::Secret, name, reason)
    }
    pub fn network(pattern: &str, reason: &str) -> Self {
        Self::new(wire::CapabilityKind::Network, pattern, reason)
    }
    fn new(kind: wire::CapabilityKind, target: &str, reason: &str) -> Self {
        Capability {
            kind,
            target: target.into(),
            reason: reason.into(),
        }
    }
}

/// A node declaration, built fluently. Everything the host and the graph editor know
/// about a node comes from here.
#[derive(Clone, Debug)]
pub struct Decl {
    d: wire::NodeDecl,
    controlled: bool,
}

fn port(
    name: &str,
    ty: String,
    required: bool,
    default: Option<Value>,
    description: &str,
) -> wire::PortDecl {
    wire::PortDecl {
        name: name.into(),
        type_: ty,
        required,
        default: default.map(|v| v.to_wire()),
        description: description.into(),
    }
}

impl Decl {
    pub fn new(type_name: &str) -> Self {
        Decl {
            d: wire::NodeDecl {
                type_name: type_name.into(),
                title: String::new(),
                description: String::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                properties: Vec::new(),
                retry_safe: false,
                streaming_output: false,
                streaming_input: false,
                reuse_instance: false,
                capabilities: Vec::new(),
            },
            controlled: false,
        }
    }

    pub fn title(mut self, t: &str) -> Self {
        self.d.title = t.into();
        self
    }

    pub fn description(mut self, d: &str) -> Self {
        self.d.description = d.trim().into();
        self
    }

    /// Sets title (first line) and description (the rest) from doc-comment text.
    pub fn doc(mut self, doc: &str) -> Self {
        let doc = doc.trim();
        let (first, rest) = doc.split_once('\n').unwrap_or((doc, ""));
        if self.d.title.is_empty() {
            self.d.title = first.trim().trim_end_matches('.').into();
        }
        let rest: Vec<&str> = rest.lines().map(str::trim).collect();
        self.d.description = if rest.iter().all(|l| l.is_empty()) {
            first.trim().into()
        } else {
            rest.join("\n").trim().into()
        };
        self
    }

    /// An input whose port type comes from `T` (`Option<T>` makes it optional).
    pub fn input<T: PortValue>(mut self, name: &str, description: &str) -> Self {
        self.d
            .inputs
            .push(port(name, T::port_type(), T::required(), None, description));
        self
    }

    /// An optional input with a default used when nothing feeds it.
    pub fn input_default<T: PortValue>(
        mut self,
        name: &str,
        default: T,
        description: &str,
    ) -> Self {
        self.d.inputs.push(port(
            name,
            T::port_type(),
            false,
            Some(default.into_value()),
            description,
        ));
        self
    }

    /// A configuration property (set in the graph document, never fed by an edge).
    pub fn property<T: PortValue>(
        mut self,
        name: &str,
        default: Option<T>,
        description: &str,
    ) -> Self {
        let required = T::required() && default.is_none();
        self.d.properties.push(port(
            name,
            T::port_type(),
            required,
            default.map(T::into_value),
            description,
        ));
        self
    }

    pub fn output<T: PortValue>(self, name: &str, description: &str) -> Self {
        self.output_with::<T>(name, Correlation::Single, description)
    }

    pub fn output_with<T: PortValue>(
        mut self,
        name: &str,
        c: Correlation,
        description: &str,
    ) -> Self {
        self.d.outputs.push(wire::OutputDecl {
            name: name.into(),
            type_: T::port_type(),
            correlation: match c {
                Correlation::Single => wire::OutputCorrelation::Single,
                Correlation::Iteration => wire::OutputCorrelation::Iteration,
                Correlation::Chunk => wire::OutputCorrelation::Chunk,
                Correlation::Aggregate => wire::OutputCorrelation::Aggregate,
            },
            description: description.into(),
        });
        self
    }

    /// Re-running with the same inputs is harmless (pure functions, idempotent reads).
    pub fn retry_safe(mut self) -> Self {
        self.d.retry_safe = true;
        self
    }

    /// The node calls [`emit`] while it runs.
    pub fn streaming_output(mut self) -> Self {
        self.d.streaming_output = true;
        self
    }

    /// The node pulls its inputs with [`next_input`].
    pub fn streaming_input(mut self) -> Self {
        self.d.streaming_input = true;
        self
    }

    /// One instance may serve many invocations (the node keeps no state between them
    /// that could leak across runs). Saves instantiation; off by default.
    pub fn reuse_instance(mut self) -> Self {
        self.d.reuse_instance = true;
        self
    }

    pub fn capability(mut self, c: Capability) -> Self {
        self.d.capabilities.push(wire::CapabilityRequest {
            kind: c.kind,
            target: c.target,
            reason: c.reason,
        });
        self
    }

    /// Makes the node controlled: it runs once per `run` event a controller sends it
    /// (over a control edge into its `__control__` handle), with its latest inputs and
    /// the event's property overrides, and its outputs are the event's reply.
    pub fn controlled(mut self) -> Self {
        self.controlled = true;
        self
    }

    /// Whether [`Decl::controlled`] was set.
    pub fn is_controlled(&self) -> bool {
        self.controlled
    }

    #[doc(hidden)]
    pub fn into_wire(self) -> wire::NodeDecl {
        self.d
    }
}

// ----- invocation -----------------------------------------------------------------

/// The inputs of one invocation (edge values and properties; edge values win).
#[derive(Debug, Default)]
pub struct Inputs {
    values: BTreeMap<String, Value>,
    properties: BTreeMap<String, Value>,
}

impl Inputs {
    pub fn new(values: BTreeMap<String, Value>) -> Self {
        Inputs {
            values,
            properties: BTreeMap::new(),
        }
    }

    /// A typed input. Missing (or null) inputs are an error unless `T` is `Option<_>`.
    pub fn get<T: PortValue>(&mut self, name: &str) -> Result<T, Error> {
        match self
            .values
            .remove(name)
            .or_else(|| self.properties.get(name).cloned())
        {
            Some(Value::Null) | None => T::absent().ok_or_else(|| {
                Error::new(format!("input `{name}` is missing")).signature("input:missing")
            }),
            Some(v) => T::from_value(v)
                .map_err(|e| Error::new(format!("input `{name}`: {e}")).signature("input:type")),
        }
    }

    /// A typed input with a fallback when it is absent.
    pub fn get_or<T: PortValue>(&mut self, name: &str, default: T) -> Result<T, Error> {
        match self.get::<Option<T>>(name)? {
            Some(v) => Ok(v),
            None => Ok(default),
        }
    }

    /// The raw value, if present.
    pub fn raw(&self, name: &str) -> Option<&Value> {
        self.values.get(name).or_else(|| self.properties.get(name))
    }

    /// The node's configured properties alone.
    pub fn properties(&self) -> &BTreeMap<String, Value> {
        &self.properties
    }
}

/// Output values of one invocation.
#[derive(Debug, Default, Clone)]
pub struct Outputs(Vec<(String, Value)>);

impl Outputs {
    pub fn new() -> Self {
        Outputs(Vec::new())
    }

    pub fn one(handle: &str, v: impl PortValue) -> Self {
        Outputs::new().with(handle, v)
    }

    pub fn with(mut self, handle: &str, v: impl PortValue) -> Self {
        self.0.push((handle.into(), v.into_value()));
        self
    }

    fn into_wire(self) -> Vec<(String, wire::Value)> {
        self.0.into_iter().map(|(h, v)| (h, v.to_wire())).collect()
    }
}

/// A recoverable node error. The host adds the node id; host failures (fuel, deadline,
/// memory) are never reported through this type.
#[derive(Debug, Clone)]
pub struct Error {
    message: String,
    signature: Option<String>,
    candidate: Option<Outputs>,
}

impl Error {
    pub fn new(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            signature: None,
            candidate: None,
        }
    }

    /// A stable failure signature, `family:code` (e.g. `json:parse`), so a supervisor
    /// recognises repeats and policy rules can match it. The host ignores any other
    /// shape, so a malformed one is refused here: the error then carries no signature
    /// and its message says which signature was refused, why, and where it was written.
    #[track_caller]
    pub fn signature(mut self, sig: &str) -> Self {
        match signature::check(sig) {
            Ok(()) => self.signature = Some(sig.into()),
            Err(why) => {
                let at = std::panic::Location::caller();
                self.message = format!(
                    "{why} at {}:{}; the error was: {}",
                    at.file(),
                    at.line(),
                    self.message
                );
                self.signature = None;
            }
        }
        self
    }

    /// The malformed output a supervisor may repair and substitute.
    pub fn candidate(mut self, handle: &str, v: impl PortValue) -> Self {
        let c = self.candidate.take().unwrap_or_default();
        self.candidate = Some(c.with(handle, v));
        self
    }

    fn into_wire(self) -> wire::NodeError {
        wire::NodeError {
            message: self.message,
            signature: self.signature,
            candidate: self.candidate.map(Outputs::into_wire),
        }
    }
}

impl<T: std::fmt::Display> From<T> for Error {
    fn from(e: T) -> Self {
        Error::new(e.to_string())
    }
}

/// A node type. The [`node!`] macro implements this for a function; implement it by
/// hand for streaming nodes or full control over the declaration.
pub trait Node {
    const TYPE: &'static str;
    fn declare() -> Decl;
    fn run(inputs: &mut Inputs) -> Result<Outputs, Error>;
}

// ----- host calls -----------------------------------------------------------------

/// Logging into the run's event stream (capped per invocation).
pub mod log {
    use super::host;
    use super::wire::LogLevel;

    pub fn debug(msg: &str) {
        host::log(LogLevel::Debug, msg);
    }
    pub fn info(msg: &str) {
        host::log(LogLevel::Info, msg);
    }
    pub fn warn(msg: &str) {
        host::log(LogLevel::Warn, msg);
    }
    pub fn error(msg: &str) {
        host::log(LogLevel::Error, msg);
    }
}

/// Sends a value downstream now (streaming-output and streaming-input nodes). An error
/// means the run is shutting down or the value was refused; return from `run`.
pub fn emit(handle: &str, v: impl PortValue) -> Result<(), Error> {
    host::emit(handle, &v.into_value().to_wire()).map_err(|e| Error::new(e).signature("heddle:emit"))
}

/// The next input value (streaming-input nodes): `(handle, value)`, or `None` when all
/// inputs are closed.
pub fn next_input() -> Option<(String, Value)> {
    host::next_input().map(|(h, v)| (h, Value::from_wire(v)))
}

/// Whether the run was cancelled or the deadline passed. Long loops should check it;
/// the host stops the guest anyway shortly after.
pub fn cancelled() -> bool {
    host::cancelled()
}

/// Milliseconds left before the invocation's deadline.
pub fn deadline_ms() -> Option<u64> {
    host::deadline_ms()
}

/// A secret granted by the operator; `None` when not granted or not set.
pub fn secret(name: &str) -> Option<String> {
    host::get_secret(name)
}

pub fn report_cost(usd: f64) {
    host::report_cost(usd);
}

pub fn record_asset(id: &str) {
    host::record_asset(id);
}

/// Controllers: driving the controlled nodes a control edge from this node reaches.
///
/// The node's `_control_context` input (read it with [`Inputs::raw`] or
/// [`context`]) describes them, by node id: `node_type`, `properties` (each with its
/// `type`, `default`, configured `value`) and the `run` action's schema. [`send`]
/// queues a `run` event with property overrides and returns a [`Ticket`]; events sent
/// before any reply is awaited are in flight together and answered in the order sent.
pub mod control {
    use std::collections::BTreeMap;

    use super::{Error, Inputs, Value, host};

    /// The input the host gives a controller its context on.
    pub const CONTEXT_INPUT: &str = "_control_context";

    /// The control context of this invocation (an object by controlled node id);
    /// `None` when no control edge leaves the node.
    pub fn context(inputs: &Inputs) -> Option<&Value> {
        inputs.raw(CONTEXT_INPUT)
    }

    /// A `run` event on its way; [`Ticket::reply`] waits for the target's outputs.
    #[must_use = "a ticket's reply should be awaited"]
    pub struct Ticket(u64);

    impl Ticket {
        /// The outputs of the invocation the event caused, by output name.
        pub fn reply(self) -> Result<BTreeMap<String, Value>, Error> {
            host::control_reply(self.0)
                .map(|entries| {
                    entries
                        .into_iter()
                        .map(|(k, v)| (k, Value::from_wire(v)))
                        .collect()
                })
                .map_err(|e| Error::new(e).signature("control:failed"))
        }
    }

    /// Sends a `run` event with `properties` (overrides for that run only) to the
    /// controlled node `target`. Refused, naming the nodes and the property, when no
    /// control edge from this node reaches `target` or the target has no such property.
    pub fn send(target: &str, properties: &[(&str, Value)]) -> Result<Ticket, Error> {
        let wire: Vec<(String, super::wire::Value)> = properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_wire()))
            .collect();
        host::control_send(target, &wire)
            .map(Ticket)
            .map_err(|e| Error::new(e).signature("control:refused"))
    }

    /// [`send`], then its [`Ticket::reply`].
    pub fn run(target: &str, properties: &[(&str, Value)]) -> Result<BTreeMap<String, Value>, Error> {
        send(target, properties)?.reply()
    }
}

// ----- export glue ----------------------------------------------------------------

#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::exports::heddle::node::node::Guest;
    pub use crate::bindings::heddle::node::types::{NodeDecl, NodeError, Value as WireValue};

    use super::*;

    pub fn run<N: Node>(
        inputs: Vec<(String, WireValue)>,
        properties: Vec<(String, WireValue)>,
    ) -> Result<Vec<(String, WireValue)>, NodeError> {
        let mut i = Inputs {
            values: inputs
                .into_iter()
                .map(|(k, v)| (k, Value::from_wire(v)))
                .collect(),
            properties: properties
                .into_iter()
                .map(|(k, v)| (k, Value::from_wire(v)))
                .collect(),
        };
        N::run(&mut i)
            .map(Outputs::into_wire)
            .map_err(Error::into_wire)
    }

    pub fn unknown(type_name: &str) -> NodeError {
        Error::new(format!("this package has no node type `{type_name}`"))
            .signature("heddle:unknown-type")
            .into_wire()
    }
}

/// Exports the listed node types as this component's package. Use once per crate.
#[macro_export]
macro_rules! export_nodes {
    ($($node:ty),+ $(,)?) => {
        struct __HeddlePackage;

        impl $crate::__private::Guest for __HeddlePackage {
            fn describe() -> ::std::vec::Vec<$crate::__private::NodeDecl> {
                ::std::vec![$( <$node as $crate::Node>::declare().into_wire() ),+]
            }

            fn controlled() -> ::std::vec::Vec<::std::string::String> {
                let mut v = ::std::vec::Vec::new();
                $(
                    if <$node as $crate::Node>::declare().is_controlled() {
                        v.push(::std::string::String::from(<$node as $crate::Node>::TYPE));
                    }
                )+
                v
            }

            fn invoke(
                type_name: ::std::string::String,
                inputs: ::std::vec::Vec<(::std::string::String, $crate::__private::WireValue)>,
                properties: ::std::vec::Vec<(::std::string::String, $crate::__private::WireValue)>,
            ) -> ::std::result::Result<
                ::std::vec::Vec<(::std::string::String, $crate::__private::WireValue)>,
                $crate::__private::NodeError,
            > {
                $(
                    if type_name == <$node as $crate::Node>::TYPE {
                        return $crate::__private::run::<$node>(inputs, properties);
                    }
                )+
                Err($crate::__private::unknown(&type_name))
            }
        }

        $crate::bindings::__heddle_export_world!(__HeddlePackage);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __node_flag {
    ($d:ident, retry_safe) => {
        $d = $d.retry_safe()
    };
    ($d:ident, reuse_instance) => {
        $d = $d.reuse_instance()
    };
    ($d:ident, controlled) => {
        $d = $d.controlled()
    };
    ($d:ident, $other:ident) => {
        compile_error!(concat!(
            "unknown node flag `",
            stringify!($other),
            "` (expected retry_safe, reuse_instance or controlled)"
        ))
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __node_input {
    ($d:ident, $arg:ident, $ty:ty) => {
        $d = $d.input::<$ty>(stringify!($arg), "")
    };
    ($d:ident, $arg:ident, $ty:ty, $default:expr) => {
        $d = $d.input_default::<$ty>(stringify!($arg), $default.into(), "")
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __node_get {
    ($i:ident, $arg:ident, $ty:ty) => {
        $i.get::<$ty>(stringify!($arg))?
    };
    ($i:ident, $arg:ident, $ty:ty, $default:expr) => {
        $i.get_or::<$ty>(stringify!($arg), $default.into())?
    };
}

/// Declares a node from a function: typed arguments become inputs (`Option<T>` is
/// optional, `= expr` sets a default), the named return becomes the output(s), the doc
/// comment becomes title and description, and flags (`retry_safe`, `reuse_instance`,
/// `controlled`) follow the type name. The body returns `Result<_, heddle_sdk::Error>`.
#[macro_export]
macro_rules! node {
    (
        $(#[doc = $doc:literal])*
        #[node($ty:literal $(, $flag:ident)* $(,)?)]
        $vis:vis fn $name:ident ( $($arg:ident : $argty:ty $(= $default:expr)?),* $(,)? )
            -> $out:ident : $outty:ty $body:block
    ) => {
        #[allow(non_camel_case_types)]
        $vis struct $name {}

        impl $crate::Node for $name {
            const TYPE: &'static str = $ty;

            fn declare() -> $crate::Decl {
                #[allow(unused_mut)]
                let mut d = $crate::Decl::new($ty).doc(concat!($($doc, "\n"),*));
                $( $crate::__node_input!(d, $arg, $argty $(, $default)?); )*
                d = d.output::<$outty>(stringify!($out), "");
                $( $crate::__node_flag!(d, $flag); )*
                d
            }

            #[allow(unused_variables)]
            fn run(inputs: &mut $crate::Inputs) -> ::std::result::Result<$crate::Outputs, $crate::Error> {
                $( let $arg: $argty = $crate::__node_get!(inputs, $arg, $argty $(, $default)?); )*
                let out: $outty = (move || -> ::std::result::Result<$outty, $crate::Error> { $body })()?;
                Ok($crate::Outputs::new().with(stringify!($out), out))
            }
        }
    };
    (
        $(#[doc = $doc:literal])*
        #[node($ty:literal $(, $flag:ident)* $(,)?)]
        $vis:vis fn $name:ident ( $($arg:ident : $argty:ty $(= $default:expr)?),* $(,)? )
            -> ( $($out:ident : $outty:ty),+ $(,)? ) $body:block
    ) => {
        #[allow(non_camel_case_types)]
        $vis struct $name {}

        impl $crate::Node for $name {
            const TYPE: &'static str = $ty;

            fn declare() -> $crate::Decl {
                #[allow(unused_mut)]
                let mut d = $crate::Decl::new($ty).doc(concat!($($doc, "\n"),*));
                $( $crate::__node_input!(d, $arg, $argty $(, $default)?); )*
                $( d = d.output::<$outty>(stringify!($out), ""); )+
                $( $crate::__node_flag!(d, $flag); )*
                d
            }

            #[allow(unused_variables)]
            fn run(inputs: &mut $crate::Inputs) -> ::std::result::Result<$crate::Outputs, $crate::Error> {
                $( let $arg: $argty = $crate::__node_get!(inputs, $arg, $argty $(, $default)?); )*
                let ($($out,)+): ($($outty,)+) =
                    (move || -> ::std::result::Result<($($outty,)+), $crate::Error> { $body })()?;
                Ok($crate::Outputs::new()$(.with(stringify!($out), $out))+)
            }
        }
    };
}
