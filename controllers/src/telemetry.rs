//! Logs and traces of the controller, set up in one place.
//!
//! Logs go to stdout (text or JSON) filtered by `RUST_LOG` (default `info`).
//! Traces are off unless an OTLP endpoint is configured, in the controller
//! config (`tracing.otlpEndpoint`) or in the standard environment
//! (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`);
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn them off
//! again. They are exported over OTLP/gRPC in batches; `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and the `OTEL_BSP_*`
//! batch settings are honoured by the SDK.
//!
//! What is traced: one `reconcile` span per reconcile with a child per
//! pipeline step (`etcdcluster::reconcile_cluster`), one span per etcd call
//! (`etcd::client`), and one per Kubernetes API request: a debug-level
//! `HTTP` span, opened by kube-client for the management API and by the
//! workload client (`connector`, target [`HTTP_SPAN_TARGET`]) for workload
//! APIs, which the trace exporter takes even when the log filter does not
//! print debug lines.

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::level_filters::LevelFilter;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;
pub use crate::config::TracingConfig;

/// Service name of the exported spans unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "etcdfleet-controller";

/// Where spans go, decided from the config and the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Export {
    Off,
    /// To this endpoint (from the config).
    Endpoint(String),
    /// To the endpoint the `OTEL_EXPORTER_OTLP_*` environment names (the
    /// exporter reads it itself).
    FromEnvironment,
}

/// Decides whether and where to export; `env` reads an environment variable.
pub fn export_target(config: &TracingConfig, env: impl Fn(&str) -> Option<String>) -> Export {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
    {
        return Export::Off;
    }
    if let Some(endpoint) = config
        .otlp_endpoint
        .as_ref()
        .filter(|e| !e.trim().is_empty())
    {
        return Export::Endpoint(endpoint.trim().to_string());
    }
    if set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
    {
        return Export::FromEnvironment;
    }
    Export::Off
}

/// Keeps the trace pipeline alive; dropping it (or [`Telemetry::shutdown`])
/// flushes what is buffered and stops the exporter.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans buffered so far. Blocks; from async code call it in
    /// `spawn_blocking`.
    pub fn flush(&self) -> Result<(), String> {
        match &self.provider {
            Some(p) => p.force_flush().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Flushes and stops the exporter. Blocks like [`Telemetry::flush`].
    pub fn shutdown(&self) -> Result<(), String> {
        match &self.provider {
            Some(p) => p.shutdown().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("trace export shutdown: {e}");
        }
    }
}

/// Installs the global subscriber: the log layer and, when [`export_target`]
/// says so, the OTLP trace layer. Must run inside a Tokio runtime (the gRPC
/// channel lives on it). Fails if the exporter cannot be built or a global
/// subscriber is already set.
pub fn init(format: LogFormat, config: &TracingConfig) -> Result<Telemetry, String> {
    let log_filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_filter(log_filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_filter(log_filter)
            .boxed(),
    };

    let provider = match export_target(config, |k| std::env::var(k).ok()) {
        Export::Off => None,
        target => Some(tracer_provider(&target)?),
    };
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("etcdfleet"))
            .with_filter(trace_filter())
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|e| format!("installing the log subscriber: {e}"))?;
    Ok(Telemetry { provider })
}

/// The target of the workload client's per-request `HTTP` spans.
pub const HTTP_SPAN_TARGET: &str = "etcdfleet::http";

/// What the trace layer takes: info and above, plus the per-request `HTTP`
/// spans (kube-client's and the workload client's), opened at debug.
fn trace_filter() -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("kube_client::client::builder", LevelFilter::DEBUG)
        .with_target(HTTP_SPAN_TARGET, LevelFilter::DEBUG)
}

fn tracer_provider(target: &Export) -> Result<SdkTracerProvider, String> {
    let builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    let builder = match target {
        Export::Endpoint(endpoint) => builder.with_endpoint(endpoint.clone()),
        _ => builder,
    };
    let exporter = builder
        .build()
        .map_err(|e| format!("OTLP trace exporter: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(SERVICE_NAME);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The trace id of `span` as 32 hex digits, when spans are exported (so a
/// log line can be found in the trace backend).
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn traces_are_off_unless_an_endpoint_is_configured() {
        assert_eq!(
            export_target(&TracingConfig::default(), env(&[])),
            Export::Off
        );
        assert_eq!(
            export_target(
                &TracingConfig::default(),
                env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])
            ),
            Export::Off
        );
    }

    #[test]
    fn config_endpoint_or_standard_environment_turns_traces_on() {
        let configured = TracingConfig {
            otlp_endpoint: Some("http://collector:4317".into()),
        };
        assert_eq!(
            export_target(&configured, env(&[])),
            Export::Endpoint("http://collector:4317".into())
        );
        for var in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ] {
            assert_eq!(
                export_target(
                    &TracingConfig::default(),
                    env(&[(var, "http://collector:4317")])
                ),
                Export::FromEnvironment,
                "{var}"
            );
        }
    }

    #[test]
    fn sdk_disabled_or_exporter_none_wins_over_any_endpoint() {
        let configured = TracingConfig {
            otlp_endpoint: Some("http://collector:4317".into()),
        };
        assert_eq!(
            export_target(&configured, env(&[("OTEL_SDK_DISABLED", "TRUE")])),
            Export::Off
        );
        assert_eq!(
            export_target(&configured, env(&[("OTEL_TRACES_EXPORTER", "none")])),
            Export::Off
        );
    }

    #[test]
    fn trace_layer_takes_kube_client_request_spans_but_not_other_debug_spans() {
        let filter = trace_filter();
        assert!(filter.would_enable("kube_client::client::builder", &tracing::Level::DEBUG));
        assert!(filter.would_enable(HTTP_SPAN_TARGET, &tracing::Level::DEBUG));
        assert!(filter.would_enable("etcdfleet_controllers::etcdcluster", &tracing::Level::INFO));
        assert!(!filter.would_enable("h2::codec", &tracing::Level::DEBUG));
    }

    #[test]
    fn tracing_section_rejects_unknown_fields() {
        let parsed: Result<TracingConfig, _> =
            etcdfleet_api::yaml::from_str("otlpEndpoint: x\nsampler: y");
        assert!(parsed.is_err());
    }
}
