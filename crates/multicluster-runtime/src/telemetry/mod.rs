//! Traces of the work a change causes across the fleet.
//!
//! Every reconcile runs in a `reconcile` span naming its controller,
//! cluster and request. A request queued from a reconcile
//! (`Controller::enqueue`, `WorkQueue::enqueue`) carries that reconcile's
//! span as its [`Cause`], and its own reconcile is the child of it: a
//! paced rollout's hub step (`multicluster-propagation`) gives members
//! their slots that way, so a trace shows the hub reconcile with the
//! member reconciles and applies it caused beneath it, although they run
//! later, in other tasks and against other clusters.
//!
//! With the `opentelemetry` feature, `OtlpTraces` exports these spans
//! over OTLP/HTTP to a collector, Jaeger or anything else that speaks
//! OTLP. Without it, a [`Cause`] is empty and costs nothing, so code that
//! records causes needs no feature of its own.

#[cfg(feature = "opentelemetry")]
mod otlp;

#[cfg(feature = "opentelemetry")]
pub use otlp::{OtlpError, OtlpTraces};

/// What caused a piece of work: the span it was taken in, to be the parent
/// of the spans of the work it caused wherever they run.
///
/// Taken with [`Cause::current`] and given to a later span with
/// [`Cause::adopt`]. Without the `opentelemetry` feature (or without an
/// OpenTelemetry layer in the subscriber) it holds nothing and adopting it
/// does nothing.
#[derive(Clone, Debug, Default)]
pub struct Cause {
    #[cfg(feature = "opentelemetry")]
    context: Option<opentelemetry::Context>,
}

impl Cause {
    /// The span this is called in, as the cause of work that runs later.
    pub fn current() -> Self {
        #[cfg(feature = "opentelemetry")]
        {
            use opentelemetry::trace::TraceContextExt;
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            let context = tracing::Span::current().context();
            let context = context.span().span_context().is_valid().then_some(context);
            Self { context }
        }
        #[cfg(not(feature = "opentelemetry"))]
        Self {}
    }

    /// Whether it holds no span (traces are not exported).
    pub fn is_empty(&self) -> bool {
        #[cfg(feature = "opentelemetry")]
        {
            self.context.is_none()
        }
        #[cfg(not(feature = "opentelemetry"))]
        true
    }

    /// Makes `span` a child of the span this cause was taken in. Call it
    /// before `span` is first entered: a span's parent is fixed once it
    /// has started.
    pub fn adopt(&self, span: &tracing::Span) {
        #[cfg(feature = "opentelemetry")]
        if let Some(context) = &self.context {
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            // Refused only when the subscriber has no OpenTelemetry layer
            // (nothing is exported then) or the span has started (a bug
            // of the caller's, which loses a link, not work).
            let _ = span.set_parent(context.clone());
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = span;
    }
}
