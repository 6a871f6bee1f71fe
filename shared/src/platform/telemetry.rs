//! What every function logs and traces (docs/operating.md "Following one event"): one
//! subscriber for all of them — JSON lines on Lambda, plain lines locally, filtered by
//! `AWS_LAMBDA_LOG_LEVEL` or `RUST_LOG` — and, only when `OTEL_EXPORTER_OTLP_ENDPOINT` is
//! set, the spans exported as OpenTelemetry traces (OTLP over HTTP/protobuf; on Lambda to
//! the ADOT collector extension at `localhost:4318`), flushed before each invocation ends.
//! A span's W3C `traceparent` rides on the SQS message that hands its work on, so one
//! delivery is one trace from the intake to its effects.

use std::collections::HashMap;
use std::future::Future;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The message attribute, and the W3C Trace Context header, that carries a span's context
/// from one function to the next.
pub const TRACEPARENT: &str = "traceparent";

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object a line, which CloudWatch Logs Insights reads field by field.
    Json,
    /// Human lines, for a terminal.
    Plain,
}

/// JSON on Lambda (whatever its log format says: our fields are only searchable as JSON)
/// and wherever `AWS_LAMBDA_LOG_FORMAT` asks for it; plain lines elsewhere.
pub fn log_format(lambda_function: Option<&str>, lambda_log_format: Option<&str>) -> LogFormat {
    let asked = lambda_log_format.is_some_and(|f| f.eq_ignore_ascii_case("json"));
    match asked || lambda_function.is_some() {
        true => LogFormat::Json,
        false => LogFormat::Plain,
    }
}

/// The filter: `AWS_LAMBDA_LOG_LEVEL` (Lambda's advanced logging controls) before
/// `RUST_LOG`, `info` when neither is set; as lambda_runtime's default subscriber reads them.
pub fn log_filter(lambda_level: Option<&str>, rust_log: Option<&str>) -> String {
    lambda_level
        .or(rust_log)
        .filter(|level| !level.trim().is_empty())
        .unwrap_or("info")
        .to_ascii_lowercase()
}

/// What one process keeps of its telemetry: the tracer provider when spans are exported.
#[derive(Clone, Default)]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Installs the process's subscriber, once, at the top of each function's `main`. `service`
/// names the function in the traces (`OTEL_SERVICE_NAME` overrides it). An exporter that
/// cannot be built leaves the logs on and says why: tracing is never a reason not to start.
pub fn init(service: &'static str) -> Telemetry {
    let lambda_function = env("AWS_LAMBDA_FUNCTION_NAME");
    let format = log_format(
        lambda_function.as_deref(),
        env("AWS_LAMBDA_LOG_FORMAT").as_deref(),
    );
    let filter = EnvFilter::new(log_filter(
        env("AWS_LAMBDA_LOG_LEVEL").as_deref(),
        env("RUST_LOG").as_deref(),
    ));
    // Lambda stamps every line with its own time. A JSON line lists its spans, outermost
    // first, so that a line written deep inside an event's work still names the event.
    let lines = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_target(false)
            .with_current_span(true)
            .with_span_list(true)
            .without_time()
            .boxed(),
        LogFormat::Plain => tracing_subscriber::fmt::layer().with_target(false).boxed(),
    };
    let (traces, failed) = match env("OTEL_EXPORTER_OTLP_ENDPOINT") {
        None => (None, None),
        Some(_) => match exporting_provider(service) {
            Ok(provider) => (Some(provider), None),
            Err(error) => (None, Some(error)),
        },
    };
    let registry = tracing_subscriber::registry().with(lines.with_filter(filter));
    match &traces {
        Some(provider) => registry.with(layer(provider, service)).init(),
        None => registry.init(),
    }
    if let Some(error) = failed {
        tracing::error!(error = %error, "traces are not exported: the OTLP exporter could not be built");
    }
    Telemetry { traces }
}

/// A provider that batches spans and sends them over OTLP/HTTP to the endpoint the standard
/// `OTEL_EXPORTER_OTLP_*` variables name (`OTEL_EXPORTER_OTLP_ENDPOINT`, headers, timeout).
fn exporting_provider(service: &'static str) -> anyhow::Result<SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(env("OTEL_SERVICE_NAME").unwrap_or_else(|| service.to_owned()))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The layer that turns this process's spans into OpenTelemetry spans of `provider`, only
/// the library's: not other crates' debug spans, nor the runtime's own invocation span, which
/// ends after the flush (it would reach the collector an invocation late, or never, leaving
/// each trace a missing root). The tests build their subscriber with it too.
pub fn layer<S>(provider: &SdkTracerProvider, service: &'static str) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(service))
        .with_filter(
            tracing_subscriber::filter::Targets::new().with_target("shared", tracing::Level::INFO),
        )
}

impl Telemetry {
    /// Sends what the invocation's spans left in the batch before Lambda freezes the process
    /// (a frozen process sends nothing, and may never thaw). On a blocking thread: the flush
    /// waits for the exporter's HTTP request.
    pub async fn flush(&self) {
        let Some(provider) = self.traces.clone() else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(error = %error, "spans not exported at the end of the invocation");
        }
    }

    /// Runs one invocation, then flushes its spans (the invocation's spans have ended by then).
    pub async fn invocation<T>(&self, work: impl Future<Output = T>) -> T {
        let answer = work.await;
        self.flush().await;
        answer
    }
}

/// The current span's context as a W3C `traceparent` value; `None` when no trace is being
/// recorded (export off), so nothing is put on the message.
pub fn traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` a child of the span a message's `traceparent` names, before the span starts;
/// a missing or malformed value leaves the span the root of a trace of its own.
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    if parent.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer is installed: then there is nothing to join.
        let _ = span.set_parent(parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lambda_logs_json_and_a_terminal_plain_lines() {
        assert_eq!(log_format(Some("inbox-worker"), None), LogFormat::Json);
        assert_eq!(
            log_format(Some("inbox-worker"), Some("Text")),
            LogFormat::Json
        );
        assert_eq!(log_format(None, Some("JSON")), LogFormat::Json);
        assert_eq!(log_format(None, None), LogFormat::Plain);
    }

    #[test]
    fn lambda_level_comes_before_rust_log() {
        assert_eq!(log_filter(Some("DEBUG"), Some("warn")), "debug");
        assert_eq!(log_filter(None, Some("shared=debug")), "shared=debug");
        assert_eq!(log_filter(None, None), "info");
        assert_eq!(log_filter(Some(""), None), "info");
    }

    #[test]
    fn no_traceparent_without_a_recorded_trace() {
        assert_eq!(traceparent(), None);
    }
}
